"""Per-step statistics of the private batch (loss, clipped fraction) are not DP: they may reach a live terminal
and nothing else, no file a DP trainer writes (checkpoints and step log included), no log line, no output."""

from __future__ import annotations

import io
import json
import logging
import math
import re
import shutil
from pathlib import Path

from rich.console import Console

from privret.data.beir import load_beir
from privret.data.pairs import pairs_from_beir
from privret.privacy.budget import BudgetPolicy
from privret.progress import Progress
from privret.train import dp_retriever as dptrain
from privret.train import dp_run
from privret.train import generator as gtrain
from privret.settings.training import DPRetrieverConfig, GeneratorTrainConfig


NON_DP_KEYS = {"loss", "losses", "train_loss", "clipped", "clip_fraction", "clipped_fraction"}


def test_stats_reach_a_terminal_and_not_a_file():
    shown = {}
    for terminal in (True, False):
        out = io.StringIO()
        with Progress(console=Console(file=out, force_terminal=terminal, width=150)) as progress:
            task = progress.add_task("training", total=2)
            progress.update(task, advance=2, stats="loss=1.234")
        shown[terminal] = out.getvalue()
    assert "loss=1.234" in shown[True]
    assert "training" in shown[False] and "1.234" not in shown[False]


def test_private_counts_reach_a_terminal_and_a_file_only_as_done():
    """A task counting a DP run's pairs logs, when written to a file, that it is done and no count (917 here)."""
    shown = {}
    for terminal in (True, False):
        out = io.StringIO()
        with Progress(console=Console(file=out, force_terminal=terminal, width=150)) as progress:
            task = progress.add_task("caching", total=917, private_counts=True)
            for _ in range(917):
                progress.advance(task)
        shown[terminal] = out.getvalue()
    assert "917" in shown[True]
    assert shown[False] == "caching: done (0s)\n"


def _record_stats(monkeypatch, module, step_name: str, losses: list[float], shown: list[float]) -> None:
    """Wrap ``module.step_name`` (a DP step): keep the loss it computed in ``losses`` and hand the rest of the run a
    distinctive stand-in (kept in ``shown``; every number of a dict of statistics replaced) in place of its
    statistics. Whatever the run does with the statistics it is handed (the display, or a leak), it does with
    numbers no file holds by chance."""
    step = getattr(module, step_name)

    def recording_step(*args, **kwargs):
        stats = step(*args, **kwargs)
        losses.append(stats if isinstance(stats, float) else stats["loss"])

        def stand_in(_):
            shown.append(12345.678901 + 1111.111 * len(shown))  # above 1e4: no format renders it as a short integer
            return shown[-1]
        return stand_in(stats) if isinstance(stats, float) else {k: stand_in(v) for k, v in stats.items()}

    monkeypatch.setattr(module, step_name, recording_step)


def _snapshot_checkpoints(monkeypatch, snapshots: Path) -> None:
    """Copy a run's output directory after every checkpoint (the checkpoint and step log are gone once the run
    finishes)."""
    save = dp_run.save_checkpoint

    def saving(ckpt_dir: Path, *args, **kwargs):
        save(ckpt_dir, *args, **kwargs)
        shutil.copytree(ckpt_dir.parent, snapshots / f"{ckpt_dir.parent.name}-{len(list(snapshots.glob('*')))}")

    monkeypatch.setattr(dp_run, "save_checkpoint", saving)


def _keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _loss_patterns(losses: list[float], shown: list[float]) -> list[re.Pattern]:
    """The stand-ins the run was handed, in every format a display or a log line would write (3 decimals, 3 and 4
    significant digits, repr), and each loss the steps computed as repr (17 significant digits: where a loss is
    written in full, no other number matches it). A computed loss is not searched for at 3 decimals: its rendering
    can equal by chance a public number a run writes (the model card's "epsilon | 1.469" lies among a toy retriever's
    losses: the likely cause of one failure in about 56 runs). A loss of exactly 0 is skipped ("lora_dropout": 0.0 is
    in every config)."""
    texts = [text for v in shown for text in (f"{v:.3f}", f"{v:.3g}", f"{v:.4g}", repr(v))]
    texts += [repr(v) for v in losses if math.isfinite(v) and v != 0.0]
    return [re.compile(rf"(?<![\d.]){re.escape(text)}(?!\d)") for text in texts]


def _leaks(text: str, patterns: list[re.Pattern]) -> list[str]:
    return [p.pattern for p in patterns if p.search(text)] + [s for s in ("loss=", "clipped=") if s in text]


def test_dp_training_writes_no_loss_or_clip_statistics(tiny_llama_dir, tiny_bert_dir, toy_beir, tmp_path,
                                                       monkeypatch, capsys, caplog):
    """A tiny DP generator run and a tiny direct-DP retriever run (public-negatives), checkpointing every step:
    no JSON / JSONL file under ``tmp_path`` (outputs, checkpoint snapshots, budget registry) has a
    loss or clip-statistics key, and no text file, captured output or log record holds the statistics the steps
    returned for the display (stand-ins, :func:`_record_stats`) or a loss they computed, written in full."""
    pairs = pairs_from_beir(load_beir(toy_beir), "train")
    losses: list[float] = []
    shown: list[float] = []
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    monkeypatch.setattr(dp_run, "calibrate_noise", lambda **plan: 1.0)  # sigma is irrelevant here, and slow
    for module, step_name in ((gtrain, "_dp_step"), (dptrain, "dp_step")):
        _record_stats(monkeypatch, module, step_name, losses, shown)
    _snapshot_checkpoints(monkeypatch, snapshots)
    caplog.set_level(logging.DEBUG)
    gtrain.train_generator(pairs, tmp_path / "gen", GeneratorTrainConfig(
        model=str(tiny_llama_dir), epsilon=8.0, batch_size=2, epochs=1, trained_layers=1, lora_rank=4, bf16=False,
        checkpoint_every=1, accountant="rdp"), data_hash="h")  # RDP: the ledgers' epsilon in ms, not seconds
    dptrain.train_dp_retriever(pairs, tmp_path / "ret", DPRetrieverConfig(
        method="public-negatives", model=str(tiny_bert_dir), epsilon=8.0, batch_size=2, epochs=1, trainable="top:1",
        max_query_tokens=32, max_doc_tokens=32, public_negatives=3, hard_negatives=0, checkpoint_every=1,
        accountant="rdp"), data_hash="h", public_corpus=pairs.corpus,
        budget=BudgetPolicy(allow_over=True))  # the second epsilon-8 release on this data passes the default cap

    assert len(losses) == 6 and len(list(snapshots.iterdir())) == 4  # 3 steps each, checkpoints at steps 1, 2
    patterns = _loss_patterns(losses, shown)
    # Every step's statistics were replaced; at least one computed loss is searched for as well. A step's batch is
    # Poisson (5 toy query units, q = 0.4: empty with probability 0.6^5 = 0.078) and the run's sampling is seeded from
    # os.urandom, so no non-empty generator step among its 3 (a generator's loss is never 0) has probability < 1e-3
    assert len(shown) >= 6 and len(patterns) >= 4 * len(shown) + 1
    texts = 0
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # weights (safetensors)
        texts += 1
        assert not _leaks(text, patterns), path
        if path.suffix == ".json":
            assert not _keys(json.loads(text)) & NON_DP_KEYS, path
        if path.suffix == ".jsonl":
            assert not set().union(*(_keys(json.loads(line)) for line in text.splitlines() if line)) & NON_DP_KEYS, path
    assert texts > 20
    captured = capsys.readouterr()
    for text in (captured.out, captured.err, caplog.text):
        assert not _leaks(text, patterns)
    assert "training generator" in captured.out  # the progress did print (a plain log line), just no statistics
