"""Settings chosen on a split are trained without it: a config that names the split its settings were chosen on
(``settings_chosen_on``) is refused when the dataset lacks that split or when the split shares a query with the
private log the rows train on; the shipped SQuAD config names its validation split."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import TOY_DOCS, TOY_TEST, TOY_TRAIN, write_beir_dir
from pydantic import ValidationError

from privret.settings.pipeline import PipelineConfig, load_config
from privret.data.beir import load_beir
from privret.errors import InputError

REPO = Path(__file__).resolve().parents[1]
REAL_SQUAD = REPO.parent / "shared" / "data" / "squad" / "squad-v1.1-dev-40.json"


def _toy(root: Path, validation: list[tuple[str, str, list[str]]] | None) -> Path:
    corpus = [{"_id": i, "title": t, "text": x} for i, t, x in TOY_DOCS]
    known = {q for q, _, _ in TOY_TRAIN + TOY_TEST}
    extra = [v for v in validation or [] if v[0] not in known]
    queries = [{"_id": q, "text": t} for q, t, _ in TOY_TRAIN + TOY_TEST + extra]
    qrels = {"train": [(q, d, 1) for q, _, ds in TOY_TRAIN for d in ds],
             "test": [(q, d, 1) for q, _, ds in TOY_TEST for d in ds]}
    if validation is not None:
        qrels["validation"] = [(q, d, 1) for q, _, ds in validation for d in ds]
    return write_beir_dir(root, corpus, queries, qrels)


class _Started(Exception):
    pass


def _refusal(dataset: Path, tmp_path: Path, monkeypatch) -> InputError | None:
    """What a pipeline with ``settings_chosen_on: validation`` says before any stage (``None``: it goes on)."""
    from privret.pipeline import run as pipeline_run

    def started(*args):
        raise _Started

    monkeypatch.setattr(pipeline_run, "check_dp_budgets", started)
    cfg = PipelineConfig(name="toy", dataset=dataset, epsilons=[math.inf], settings_chosen_on="validation")
    try:
        pipeline_run.run_pipeline(cfg, tmp_path / "run")
    except _Started:
        return None
    except InputError as err:
        assert not (tmp_path / "run").exists()  # refused before anything is written
        return err
    raise AssertionError("the pipeline neither started nor refused")


def test_a_disjoint_validation_split_is_accepted(tmp_path, monkeypatch):
    dataset = _toy(tmp_path / "ok", [("v1", "heart disease aspirin adults", ["d1"])])
    assert _refusal(dataset, tmp_path, monkeypatch) is None


@pytest.mark.parametrize("validation", [
    [("v1", "aspirin heart risk", ["d1"])],  # a training query's text under another id
    [("q2", "gene memory mice", ["d2"])],  # a training query itself
])
def test_a_choice_split_that_shares_a_query_with_the_log_is_refused(tmp_path, validation, monkeypatch):
    err = _refusal(_toy(tmp_path / "shared", validation), tmp_path, monkeypatch)
    assert err is not None and err.field == "settings_chosen_on" and "trained without it" in str(err)


def test_a_dataset_without_the_choice_split_is_refused(tmp_path, monkeypatch):
    err = _refusal(_toy(tmp_path / "plain", None), tmp_path, monkeypatch)
    assert err is not None and err.field == "settings_chosen_on" and "validation.tsv" in err.path


@pytest.mark.parametrize("split", ["train", "test"])
def test_settings_are_never_chosen_on_the_log_or_the_reported_split(tmp_path, split):
    with pytest.raises(ValidationError, match="neither trained on nor reported"):
        PipelineConfig(name="x", dataset=tmp_path, epsilons=[8.0], settings_chosen_on=split)


def test_the_shipped_squad_config_names_the_split_its_regime_was_chosen_on():
    cfg = load_config(REPO / "configs" / "squad.yaml")
    assert cfg.settings_chosen_on == "validation" and cfg.train_split == "train"


@pytest.mark.skipif(not REAL_SQUAD.is_file(), reason="needs ../shared/data/squad")
def test_the_shipped_squad_config_trains_its_dp_rows_without_the_validation_articles(tmp_path):
    """The command in the config's header (``--validation-articles 4``) gives a log of 28 articles that the
    pipeline accepts; the 32-article log, which holds the 1,095 questions the regime was scored on, is refused."""
    from privret.data.squad_beir import build_squad_beir
    from privret.pipeline.preflight import check_settings_split

    cfg = load_config(REPO / "configs" / "squad.yaml")
    header = (REPO / "configs" / "squad.yaml").read_text()
    assert "--validation-articles 4" in header
    build_squad_beir(REAL_SQUAD, tmp_path / "val", validation_articles=4)
    build_squad_beir(REAL_SQUAD, tmp_path / "all")
    val = load_beir(tmp_path / "val", splits=["train", "test"])
    check_settings_split(cfg, val)
    assert len(val.split("train")) == 5767
    with pytest.raises(InputError) as err:
        check_settings_split(cfg, load_beir(tmp_path / "all", splits=["train", "test"]))
    assert err.value.field == "settings_chosen_on"


@pytest.mark.skipif(not (REPO.parent / "shared" / "data" / "scifact").is_dir(), reason="needs ../shared/data/scifact")
@pytest.mark.parametrize("name", ["scifact.yaml", "scifact-corpus.yaml"])
def test_the_synthetic_document_sample_is_no_count_of_the_private_log(name):
    """The synthetic set's size is released with it: a shipped config's ``synthetic_documents.sample`` must not be
    read off the log (its distinct documents, pairs, query ids or units)."""
    from privret.data.pairs import pairs_from_beir

    cfg = load_config(REPO / "configs" / name)
    pairs = pairs_from_beir(load_beir(cfg.dataset, splits=[cfg.train_split]), cfg.train_split)
    counts = {len({p.doc_id for p in pairs.pairs}), len(pairs.pairs), len({p.query_id for p in pairs.pairs}),
              len(pairs.units(cfg.unit))}
    assert cfg.synthetic_documents.sample not in counts
