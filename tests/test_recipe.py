"""The retriever's recipe chosen on a validation split of its own training pairs (privret.train.recipe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.train.retriever import non_private_ledger
from privret.train import recipe
from privret.train import retriever as rtrain
from privret.settings.training import RecipeSelection, RetrieverTrainConfig


def _pairs(n_queries: int = 20, docs: int = 60) -> TrainingPairs:
    corpus = {f"d{i}": Document(f"d{i}", f"title {i}", f"text {i}") for i in range(docs)}
    pairs = []
    for q in range(n_queries):
        pairs.append(QueryDocPair(f"query {q}", f"d{q}", query_id=f"q{q}"))
        if q % 3 == 0:  # a second relevant document, and the same text under another id: one unit
            pairs.append(QueryDocPair(f"query {q}", f"d{q + 20}", query_id=f"q{q}-again"))
    return TrainingPairs(pairs, corpus)


def test_validation_split_keeps_each_query_text_whole_on_one_side():
    pairs = _pairs()
    train, queries, qrels = recipe.validation_split(pairs, 0.25, seed=3)
    held = set(queries.values())
    assert len(held) == 5  # round(0.25 * 20 units)
    assert not held & {p.query for p in train.pairs}
    assert len(train.pairs) + sum(len(d) for d in qrels.values()) == len(pairs.pairs)
    for qid, text in queries.items():
        assert set(qrels[qid]) == {p.doc_id for p in pairs.pairs if p.query == text}
    again = recipe.validation_split(pairs, 0.25, seed=3)[1]
    other = recipe.validation_split(pairs, 0.25, seed=4)[1]
    assert again == queries and set(other.values()) != held


def test_validation_split_refuses_to_leave_nothing_for_training():
    with pytest.raises(ValueError, match="cannot leave any"):
        recipe.validation_split(_pairs(n_queries=1), 0.5, seed=0)


def test_validation_corpus_is_the_relevant_documents_and_a_seeded_pool():
    corpus = _pairs().corpus
    qrels = {"v0": {"d1": 1, "d21": 1}, "v1": {"d5": 1}}
    chosen = recipe.validation_corpus(corpus, qrels, pool=10, seed=0)
    assert {"d1", "d21", "d5"} <= set(chosen) and len(chosen) == 13
    assert chosen == recipe.validation_corpus(corpus, qrels, pool=10, seed=0)
    assert recipe.validation_corpus(corpus, qrels, pool=None, seed=0) is corpus


def test_candidate_grid_is_the_product_in_sorted_order():
    assert recipe.candidate_grid({"max_doc_tokens": [256, 128], "learning_rate": [5e-5, 2e-5]}) == [
        {"learning_rate": 2e-5, "max_doc_tokens": 128}, {"learning_rate": 2e-5, "max_doc_tokens": 256},
        {"learning_rate": 5e-5, "max_doc_tokens": 128}, {"learning_rate": 5e-5, "max_doc_tokens": 256}]


def test_selection_config_refuses_unknown_fields_and_empty_values():
    with pytest.raises(ValueError, match="'epochs' cannot be selected"):
        RecipeSelection(grid={"epochs": [1, 3]})
    with pytest.raises(ValueError, match="no values"):
        RecipeSelection(grid={"learning_rate": []})


def _scripted(monkeypatch, table: dict[tuple[int, int], float], fail_at: int | None = None) -> list[dict]:
    """fit_retriever/evaluate_retriever replaced: candidate max_doc_tokens=t scores table[(t, epoch)]."""
    fits: list[dict] = []

    def fit(pairs, cfg, *, after_epoch=None):
        fits.append({"max_doc_tokens": cfg.max_doc_tokens, "epochs": cfg.epochs, "pairs": len(pairs.pairs)})
        if fail_at is not None and len(fits) == fail_at:
            raise KeyboardInterrupt
        for epoch in range(1, int(cfg.epochs) + 1):
            if after_epoch is not None:
                after_epoch(epoch, (cfg.max_doc_tokens, epoch))
        return "model"

    monkeypatch.setattr(rtrain, "fit_retriever", fit)
    monkeypatch.setattr("privret.retrieval.metrics.evaluate_retriever",
                        lambda model, corpus, queries, qrels: {"ndcg@10": table[model]})
    return fits


def test_selection_takes_the_best_epoch_of_the_best_candidate_and_resumes(monkeypatch, tmp_path):
    table = {(8, 1): 0.50, (8, 2): 0.61, (8, 3): 0.58, (16, 1): 0.55, (16, 2): 0.60, (16, 3): 0.61}
    cfg = RetrieverTrainConfig(selection=RecipeSelection(grid={"max_doc_tokens": [16, 8]}, max_epochs=3,
                                                         validation_pool=None))
    fits = _scripted(monkeypatch, table, fail_at=2)
    with pytest.raises(KeyboardInterrupt):
        recipe.select_recipe(_pairs(), cfg, work_dir=tmp_path, fit=rtrain.fit_retriever)
    assert len(json.loads((tmp_path / recipe.CANDIDATES_FILE).read_text())["candidates"]) == 1
    fits = _scripted(monkeypatch, table)
    record = recipe.select_recipe(_pairs(), cfg, work_dir=tmp_path, fit=rtrain.fit_retriever)
    assert [f["max_doc_tokens"] for f in fits] == [16]  # the finished candidate is not trained again
    # 0.61 at (8, epoch 2) and at (16, epoch 3): the tie goes to the earlier candidate, fewer epochs
    assert record["chosen"] == {"max_doc_tokens": 8, "epochs": 2}
    assert record["chosen_validation_ndcg10"] == 0.61
    assert {f["pairs"] for f in fits} == {record["settings"]["training_pairs"]} != {len(_pairs().pairs)}


class _Saved:
    device = "cpu"

    def save(self, path, safe_serialization):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights").write_text("w")


def test_train_retriever_retrains_the_chosen_recipe_on_all_pairs(monkeypatch, tmp_path):
    table = {(8, 1): 0.3, (8, 2): 0.2, (16, 1): 0.4, (16, 2): 0.7}
    fits = _scripted(monkeypatch, table)
    scripted = rtrain.fit_retriever
    monkeypatch.setattr(rtrain, "fit_retriever", lambda pairs, cfg, *, after_epoch=None: (
        scripted(pairs, cfg, after_epoch=after_epoch) and _Saved()))
    pairs = _pairs()
    cfg = RetrieverTrainConfig(epochs=1, max_doc_tokens=128,
                               selection=RecipeSelection(grid={"max_doc_tokens": [8, 16]}, max_epochs=2,
                                                         validation_pool=None))
    out = rtrain.train_retriever(pairs, tmp_path / "ret", cfg, ledger=non_private_ledger(pairs, "m", "h", "query"))
    saved = json.loads((out / "train_config.json").read_text())
    assert (saved["max_doc_tokens"], saved["epochs"], saved["selection"]) == (16, 2, None)
    assert fits[-1] == {"max_doc_tokens": 16, "epochs": 2, "pairs": len(pairs.pairs)}
    assert json.loads((out / "recipe_selection.json").read_text())["chosen"] == {"max_doc_tokens": 16, "epochs": 2}
    assert (tmp_path / "ret.selection" / recipe.CANDIDATES_FILE).exists()


def test_cli_refuses_selection_with_direct_dp_and_a_malformed_grid(toy_beir, tmp_path):
    from typer.testing import CliRunner

    from privret.cli import app

    runner = CliRunner()
    base = ["retriever", "train", "--data", str(toy_beir), "--out", str(tmp_path / "r")]
    # DP training has no selection (a validation split of private queries would need a budget of its own)
    result = runner.invoke(app, ["retriever", "train-dp", *base[2:], "--select", "default"])
    assert result.exit_code == 2 and "No such option" in result.output and "--select" in result.output
    result = runner.invoke(app, [*base, "--select", "max_doc_tokens"])
    assert isinstance(result.exception, InputError)
    assert "'max_doc_tokens' is not name=value,value" in result.exception.one_line()
    # what the selection chooses replaces what is given: given beside it, it is refused
    for extra, flag in ((["--select", "default", "--epochs", "3"], "--epochs"),
                        (["--select", "default", "--max-doc-tokens", "128"], "--max-doc-tokens"),
                        (["--select", "learning_rate=1e-5,2e-5", "--lr", "3e-5"], "--lr")):
        result = runner.invoke(app, [*base, *extra])
        assert isinstance(result.exception, InputError) and f"field '{flag}'" in result.exception.one_line()
    assert not (tmp_path / "r").exists()
    # and in a config: a value other than the default for a field the selection chooses
    with pytest.raises(ValueError, match="`max_doc_tokens` is chosen by `selection`"):
        RetrieverTrainConfig(max_doc_tokens=256, selection={})
    with pytest.raises(ValueError, match="`epochs` is chosen"):
        RetrieverTrainConfig(epochs=3, selection={"grid": {"learning_rate": [1e-5]}})
    assert RetrieverTrainConfig(max_doc_tokens=256, selection={"grid": {"learning_rate": [1e-5]}}).max_doc_tokens == 256


@pytest.mark.parametrize("epochs, scored", [(2.0, [1, 2]), (1.5, [1])])
def test_fit_scores_every_whole_epoch_in_eval_mode(tiny_bert_dir, epochs, scored):
    pairs = TrainingPairs([QueryDocPair(f"gene {w}", f"d{i}") for i, w in enumerate(("risk", "drug", "sleep", "diet"))],
                          {f"d{i}": Document(f"d{i}", "", f"{w} study") for i, w in enumerate(("risk", "drug", "sleep",
                                                                                                 "diet"))})
    seen = []
    cfg = RetrieverTrainConfig(model=str(tiny_bert_dir), epochs=epochs, batch_size=2)
    rtrain.fit_retriever(pairs, cfg, after_epoch=lambda epoch, model: seen.append((epoch, model.training)))
    assert seen == [(e, False) for e in scored]


def test_cli_max_doc_tokens_reaches_the_training_config(toy_beir, tiny_bert_dir, tmp_path):
    """--max-doc-tokens with --epochs and --seed replays a chosen recipe (recipe_selection.json's "chosen")."""
    from typer.testing import CliRunner

    from privret.cli import app

    result = CliRunner().invoke(app, ["retriever", "train", "--data", str(toy_beir), "--out", str(tmp_path / "r"),
                                      "--model", str(tiny_bert_dir), "--max-doc-tokens", "24", "--seed", "2"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "r" / "train_config.json").read_text())
    assert (saved["max_doc_tokens"], saved["seed"], saved["selection"]) == (24, 2, None)
