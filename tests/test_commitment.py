"""A published ledger names its private data only by a keyed commitment (privret.privacy.commitment): no file a
DP run leaves (model, checkpoint, synthetic set, manifest) holds a digest of the log, and a DP ledger withholds
the pair count; the operator's own comparisons (resume, re-run of a finished output) still work."""

from __future__ import annotations

import hashlib
import json
import math
import stat

import pytest

from privret.data.beir import load_beir
from privret.data.pairs import pairs_from_beir
from privret.errors import InputError
from privret.privacy import budget as budget_registry
from privret.privacy import commitment
from privret.privacy.ledger import PrivacyLedger
from privret.train import dp_run
from privret.train.generator import train_generator
from privret.settings.training import GeneratorTrainConfig

RAW = hashlib.sha256(b"the private log").hexdigest()


def _ledger(**update) -> PrivacyLedger:
    values = dict(mechanism="dp-sgd", epsilon=8.0, delta=1e-3, noise_multiplier=0.7, sample_rate=0.1, steps=10,
                  planned_steps=10, accountant="prv", unit="query", n_units=500, n_pairs=612, clip_norm=1.0,
                  model="m", trainable="lora", data_hash=RAW, dataset_id=f"sha256-{RAW[::-1]}")
    return PrivacyLedger(**(values | update))


def test_commitment_is_keyed_deterministic_and_idempotent(tmp_path, monkeypatch):
    monkeypatch.setenv(commitment.KEY_ENV, str(tmp_path / "a" / "ledger.key"))
    first = commitment.commit(RAW)
    assert first.startswith(commitment.PREFIX) and RAW not in first
    assert commitment.commit(RAW) == first and commitment.commit(first) == first and commitment.commit("") == ""
    assert commitment.commit(RAW + "0") != first
    key = tmp_path / "a" / "ledger.key"
    assert len(key.read_bytes()) == commitment.KEY_BYTES and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not [p for p in key.parent.iterdir() if p != key]  # the staged file is gone
    monkeypatch.setenv(commitment.KEY_ENV, str(tmp_path / "b" / "ledger.key"))
    assert commitment.commit(RAW) != first  # another installation's key: unrelated


def test_a_damaged_key_is_refused_not_replaced(tmp_path, monkeypatch):
    key = tmp_path / "ledger.key"
    key.write_bytes(b"short")
    monkeypatch.setenv(commitment.KEY_ENV, str(key))
    with pytest.raises(RuntimeError, match="ledger key has 32 bytes"):
        commitment.commit(RAW)
    assert key.read_bytes() == b"short"


def test_a_saved_dp_ledger_holds_commitments_and_no_pair_count(tmp_path):
    selection = _ledger(mechanism="laplace-partition-selection", epsilon=1.0, n_pairs=612)
    ledger = _ledger().compose(selection)
    text = ledger.save(tmp_path).read_text()
    assert RAW not in text and RAW[::-1] not in text
    saved = json.loads(text)
    assert saved["data_hash"] == commitment.commit(RAW) and saved["dataset_id"] == commitment.commit(f"sha256-{RAW[::-1]}")
    assert saved["n_pairs"] is None and [part["n_pairs"] for part in saved["parts"]] == [None, None]
    assert all(part["data_hash"] == commitment.commit(RAW) for part in saved["parts"])
    assert ledger.n_pairs == 612 and ledger.data_hash == RAW  # in memory: raw, for the budget registry
    loaded = PrivacyLedger.load(tmp_path)
    assert loaded.created_at and all(part.created_at for part in loaded.parts)  # each release stamped when saved
    unstamped = loaded.model_copy(update={"created_at": "", "parts": [
        part.model_copy(update={"created_at": ""}) for part in loaded.parts]})
    assert unstamped == ledger.published() and loaded.published() == loaded
    assert RAW not in json.dumps({"ledger": ledger.model_dump(mode="json")})  # manifests and results JSON too


@pytest.mark.parametrize("ledger", [_ledger(mechanism="none", epsilon=math.inf, delta=0.0),
                                    PrivacyLedger.public("public-pairs", model="m", public_data_hash="p", unit="query",
                                                         n_pairs=612)])
def test_ledgers_without_a_dp_claim_keep_their_pair_count(tmp_path, ledger):
    assert json.loads(ledger.save(tmp_path).read_text())["n_pairs"] == 612


def test_a_dp_run_leaves_no_digest_of_the_log_and_still_knows_its_own_output(tiny_llama_dir, toy_beir, tmp_path,
                                                                             monkeypatch):
    """Every file of a tiny DP generator run, its checkpoints included, is searched for the raw data hash and the
    raw registry id; the budget registry (the operator's) is keyed by the raw id; a re-run of the finished output
    is recognised, and one on other data is refused."""
    pairs = pairs_from_beir(load_beir(toy_beir), "train")
    raw_id = budget_registry.dataset_id(pairs)
    monkeypatch.setattr(dp_run, "calibrate_noise", lambda **plan: 1.0)
    snapshots = []
    save = dp_run.save_checkpoint

    def saving(ckpt_dir, *args, **kwargs):
        save(ckpt_dir, *args, **kwargs)
        snapshots.append({p.name: p.read_bytes() for p in ckpt_dir.iterdir() if p.is_file()})

    monkeypatch.setattr(dp_run, "save_checkpoint", saving)
    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=8.0, batch_size=2, epochs=1, trained_layers=1,
                               lora_rank=4, bf16=False, checkpoint_every=1, accountant="rdp")
    ledger = train_generator(pairs, tmp_path / "gen", cfg, data_hash=RAW)
    assert ledger.dataset_id == raw_id and snapshots
    files = [p.read_bytes() for p in (tmp_path / "gen").rglob("*") if p.is_file()]
    files += [content for snapshot in snapshots for content in snapshot.values()]
    for secret in (RAW, raw_id.removeprefix("sha256-")):
        assert not [f for f in files if secret.encode() in f]
    assert commitment.commit(RAW).encode() in (tmp_path / "gen" / "privacy_ledger.json").read_bytes()
    assert (budget_registry.budget_dir() / f"{raw_id}.jsonl").is_file()
    shown = PrivacyLedger.load(tmp_path / "gen").dataset_id  # the operator finds the releases from the file
    assert shown != raw_id and budget_registry.releases(shown) == budget_registry.releases(raw_id) != []
    assert train_generator(pairs, tmp_path / "gen", cfg, data_hash=RAW, resume=True).steps == ledger.steps
    with pytest.raises(InputError, match="already holds a generator trained with data_hash="):
        train_generator(pairs, tmp_path / "gen", cfg, data_hash=RAW[::-1], resume=True)
