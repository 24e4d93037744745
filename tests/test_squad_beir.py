"""SQuAD -> BEIR conversion (privret data squad-beir) and configs/squad.yaml."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import SHARED_DATA
from privret.data.beir import load_beir
from privret.data.squad_beir import build_squad_beir
from privret.errors import InputError

REPO = Path(__file__).resolve().parents[1]
REAL_SQUAD = SHARED_DATA / "squad" / "squad-v1.1-dev-40.json"


def _squad(n_articles: int = 5) -> dict:
    """``n_articles`` articles of 1-2 paragraphs and 1-3 questions each; question ids say where they belong."""
    data = []
    for a in range(n_articles):
        paragraphs = [{"context": f"Paragraph {p} of article {a} about topic {a}.",
                       "qas": [{"id": f"q{a}-{p}-{k}", "question": f"Question {k} on paragraph {p} of {a}?",
                                "answers": [f"topic {a}"]} for k in range(1 + (a + p) % 3)]}
                      for p in range(1 + a % 2)]
        data.append({"title": f"Article_{a}", "paragraphs": paragraphs})
    return {"version": "1.1", "data": data}


def _write(tmp_path: Path, obj: dict, name: str = "squad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def _article_of(doc_id: str) -> str:
    return doc_id.split("-")[0]


def test_split_by_article_with_own_paragraph_qrels(tmp_path):
    squad = _squad()
    manifest = build_squad_beir(_write(tmp_path, squad), tmp_path / "beir", test_articles=2, seed=0)
    ds = load_beir(tmp_path / "beir")
    paragraphs = {f"{a}-{p}": par for a, art in enumerate(squad["data"]) for p, par in enumerate(art["paragraphs"])}
    assert set(ds.corpus) == set(paragraphs)  # every paragraph, ids <article>-<paragraph>
    assert all(ds.corpus[i].text == par["context"] for i, par in paragraphs.items())
    assert ds.corpus["0-0"].title == "Article 0"
    questions = {qa["id"]: (i, qa["question"]) for i, par in paragraphs.items() for qa in par["qas"]}
    assert ds.queries == {q: text for q, (_, text) in questions.items()}
    assert set(ds.qrels) == {"train", "test"}
    assert set(ds.qrels["train"]) | set(ds.qrels["test"]) == set(questions)
    for qrels in ds.qrels.values():
        for qid, docs in qrels.items():
            assert docs == {questions[qid][0]: 1}  # its own paragraph, nothing else
    articles = {name: {_article_of(d) for docs in ds.qrels[name].values() for d in docs} for name in ds.qrels}
    assert not articles["train"] & articles["test"]
    assert len(articles["test"]) == 2 and len(articles["train"]) == 3
    assert [len(manifest["splits"][s]["articles"]) for s in ("train", "test")] == [3, 2]
    assert manifest["splits"]["test"]["queries"] == len(ds.qrels["test"])


def test_split_is_seeded_and_independent_of_file_order(tmp_path):
    squad = _squad(8)
    forward = _write(tmp_path, squad)
    backward = _write(tmp_path, dict(squad, data=squad["data"][::-1]), "reversed.json")

    def test_questions(path, out, seed):  # question ids name their article, so equal sets = equal split
        build_squad_beir(path, tmp_path / out, test_articles=3, seed=seed)
        return set(load_beir(tmp_path / out).qrels["test"])

    first = test_questions(forward, "a", 0)
    assert test_questions(forward, "b", 0) == first
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert test_questions(backward, "reversed", 0) == first
    assert test_questions(forward, "seed1", 1) != first


@pytest.mark.parametrize("corrupt, field", [
    (lambda s: s["data"][3]["paragraphs"][0]["qas"][0].pop("question"), "data[3].paragraphs[0].qas[0].question"),
    (lambda s: s["data"][1]["paragraphs"][1].update(context=7), "data[1].paragraphs[1].context"),
    (lambda s: s["data"][2].update(paragraphs="none"), "data[2].paragraphs"),
    (lambda s: s["data"][4]["paragraphs"][0]["qas"][1].update(id="q0-0-0"), "data[4].paragraphs[0].qas[1].id"),
])
def test_bad_input_names_the_field_and_writes_nothing(tmp_path, corrupt, field):
    squad = _squad()
    corrupt(squad)
    with pytest.raises(InputError) as err:
        build_squad_beir(_write(tmp_path, squad), tmp_path / "beir", test_articles=2)
    assert err.value.field == field and err.value.path.endswith("squad.json")
    assert not (tmp_path / "beir").exists()


@pytest.mark.parametrize("test_articles", [0, 5])
def test_test_articles_must_leave_both_splits_non_empty(tmp_path, test_articles):
    with pytest.raises(InputError) as err:
        build_squad_beir(_write(tmp_path, _squad()), tmp_path / "beir", test_articles=test_articles)
    assert err.value.field == "test_articles"


def test_impossible_questions_are_left_out(tmp_path):
    squad = _squad()
    squad["data"][0]["paragraphs"][0]["qas"][0]["is_impossible"] = True
    manifest = build_squad_beir(_write(tmp_path, squad), tmp_path / "beir", test_articles=2)
    assert manifest["impossible_questions_left_out"] == 1
    assert "q0-0-0" not in load_beir(tmp_path / "beir").queries


def test_cli_data_squad_beir(tmp_path):
    from typer.testing import CliRunner

    from privret.cli import app

    runner = CliRunner()
    squad = _write(tmp_path, _squad())
    res = runner.invoke(app, ["data", "squad-beir", "--squad", str(squad), "--out", str(tmp_path / "beir"),
                              "--test-articles", "1", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "train: 4 articles" in res.output and "test: 1 articles" in res.output
    assert json.loads((tmp_path / "beir" / "manifest.json").read_text())["seed"] == 3
    res = runner.invoke(app, ["data", "squad-beir", "--squad", str(squad), "--out", str(tmp_path / "beir")])
    assert isinstance(res.exception, InputError) and "already exists" in res.exception.message


def test_squad_config_loads_once_the_dataset_exists(tmp_path):
    from privret.settings.pipeline import load_config

    config = tmp_path / "repo" / "configs" / "squad.yaml"
    config.parent.mkdir(parents=True)
    shutil.copy(REPO / "configs" / "squad.yaml", config)
    build_squad_beir(_write(tmp_path, _squad()), tmp_path / "repo" / "runs" / "squad-beir", test_articles=2,
                     validation_articles=1)
    cfg = load_config(config)
    assert cfg.dataset == (tmp_path / "repo" / "runs" / "squad-beir").resolve()
    ds = load_beir(cfg.dataset, [cfg.train_split, cfg.eval_split, cfg.settings_chosen_on])
    assert ds.qrels["train"] and ds.qrels["test"] and ds.qrels["validation"]
    assert cfg.synthetic_documents.source == "corpus" and cfg.synthetic_documents.sample
    assert cfg.epsilons == [float("inf"), 8, 3]
    # the direct-DP regime chosen on the carved validation split (bench/direct_regimes.sh), validated at load
    assert cfg.direct_dp.methods == ["public-negatives"] and cfg.direct_dp.epsilons == [8, 3]
    row = cfg.direct_dp.config("public-negatives", 8, cfg.unit)
    assert row.trainable == "bias-top:3" and row.hard_negatives == 2
    # one random public negative a step, no dropout (docs/benchmarks.md)
    assert row.public_negatives == 1 and row.dropout is False


@pytest.mark.skipif(not (SHARED_DATA / "scifact").is_dir(), reason="../shared/data/scifact not present")
def test_scifact_config_carries_the_squad_regime_as_its_rule():
    """configs/scifact.yaml's public-negatives row is the regime chosen on SQuAD's validation split
    (configs/squad.yaml's), carried unchanged in what it trains; by the rule of the log's size it takes all 807
    units (q = 1) in each of 48 steps where SQuAD's 5,747 units take 512 for 4 epochs; the other methods keep the
    baselines' settings."""
    import yaml

    from privret.settings.pipeline import DirectDPGrid, load_config

    cfg = load_config(REPO / "configs" / "scifact.yaml")
    row = cfg.direct_dp.config("public-negatives", 8.0, cfg.unit)
    squad = DirectDPGrid(**yaml.safe_load((REPO / "configs" / "squad.yaml").read_text())["direct_dp"])
    squad_row = squad.config("public-negatives", 8.0, cfg.unit)
    assert row == squad_row
    assert (row.scheduled(807).batch_size, row.scheduled(807).epochs) == (807, 48)
    assert (squad_row.scheduled(5747).batch_size, squad_row.scheduled(5747).epochs) == (512, 4)
    assert cfg.direct_dp.config("batch-clip", 8.0, cfg.unit).trainable != "bias-top:3"


@pytest.mark.skipif(not (SHARED_DATA / "scifact").is_dir(), reason="../shared/data/scifact not present")
def test_scifact_config_prompted_bar_shows_the_benchmarks_public_claims():
    """configs/scifact.yaml's epsilon = 0 prompted row shows exactly the examples the benchmarks' prompted bar
    showed (bench/scifact_public_claims.tsv: corpus id, claim), its documents read from the corpus by id."""
    from privret.settings.pipeline import load_config

    cfg = load_config(REPO / "configs" / "scifact.yaml")
    corpus = load_beir(cfg.dataset, splits=[]).corpus
    claims = [line.split("\t") for line in (REPO / "bench" / "scifact_public_claims.tsv").read_text().splitlines()]
    assert cfg.public_rows.prompted
    shots = cfg.public_rows.few_shot(corpus)
    assert len(shots) == 3 and shots == [(corpus[doc_id].full_text, claim) for doc_id, claim in claims]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not REAL_SQUAD.is_file(), reason="../shared/data/squad not present")
def test_real_squad_file(tmp_path):
    manifest = build_squad_beir(REAL_SQUAD, tmp_path / "beir")
    ds = load_beir(tmp_path / "beir")
    assert len(ds.corpus) == manifest["documents"] == 1703
    assert len(ds.queries) == len(ds.qrels["train"]) + len(ds.qrels["test"]) == 8397
    assert [len(manifest["splits"][s]["articles"]) for s in ("train", "test")] == [32, 8]
    articles = {name: {_article_of(d) for docs in ds.qrels[name].values() for d in docs} for name in ds.qrels}
    assert not articles["train"] & articles["test"]


def test_a_validation_split_takes_whole_training_articles_in_hashed_order(tmp_path):
    """--validation-articles K: the questions of K training articles (the first in sha256("validation:<index>")
    order) leave the log for a ``validation`` split; test is untouched; no article is in two splits."""
    import hashlib

    squad = _squad(8)
    build_squad_beir(_write(tmp_path, squad), tmp_path / "plain", test_articles=2, seed=1)
    build_squad_beir(_write(tmp_path, squad), tmp_path / "val", test_articles=2, seed=1, validation_articles=2)
    plain, val = load_beir(tmp_path / "plain"), load_beir(tmp_path / "val")
    assert set(val.qrels) == {"train", "validation", "test"} and val.qrels["test"] == plain.qrels["test"]
    train_articles = sorted({_article_of(d) for docs in plain.qrels["train"].values() for d in docs})
    want = sorted(train_articles, key=lambda a: hashlib.sha256(f"validation:{a}".encode()).hexdigest())[:2]
    got = {_article_of(d) for docs in val.qrels["validation"].values() for d in docs}
    assert got == set(want)
    assert set(val.qrels["train"]) | set(val.qrels["validation"]) == set(plain.qrels["train"])
    assert not set(val.qrels["train"]) & set(val.qrels["validation"])
    with pytest.raises(InputError) as err:
        build_squad_beir(_write(tmp_path, squad), tmp_path / "bad", test_articles=2, validation_articles=6)
    assert err.value.field == "validation_articles" and not (tmp_path / "bad").exists()


@pytest.mark.skipif(not REAL_SQUAD.is_file(), reason="needs ../shared/data/squad")
def test_the_real_validation_split_is_the_one_the_benchmarks_used(tmp_path):
    """On the shared 40 articles: 4 validation articles hold 1,095 questions (docs/benchmarks.md)."""
    manifest = build_squad_beir(REAL_SQUAD, tmp_path / "beir", validation_articles=4)
    assert {s: v["queries"] for s, v in manifest["splits"].items()} == {"train": 5767, "validation": 1095,
                                                                         "test": 1535}
