"""The bundled demo dataset keeps the property that makes the demo show a trade-off.

Its queries call internal systems by nicknames that no document uses (so the public encoder cannot
tell which system a query means), every test query's nickname is learnt from training queries about
other documents of the same system, and train and test are disjoint. The committed files are exactly
what ``tools/make_demo_dataset.py`` writes.
"""

from __future__ import annotations

import re

import pytest

from helpers import load_script
from privret.data.beir import load_beir
from privret.data.demo import demo_dataset_dir


@pytest.fixture(scope="module")
def generator():
    return load_script("tools/make_demo_dataset.py")


@pytest.fixture(scope="module")
def demo():
    return load_beir(demo_dataset_dir(), splits=["train", "test"])  # validates ids, fields, qrels references


def _mentions(text: str, phrase: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(phrase.lower())}(?![\w-])", text.lower()) is not None


def test_committed_files_are_the_generators_output(generator, tmp_path):
    generator.write_beir(tmp_path / "demo", generator.make_dataset())
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        assert (tmp_path / "demo" / name).read_bytes() == (demo_dataset_dir() / name).read_bytes(), name


def test_train_and_test_are_disjoint(demo):
    train, test = demo.split("train"), demo.split("test")
    assert len(demo.corpus) == 160 and len(train) == 170 and len(test) == 80
    assert not train.keys() & test.keys()
    assert not {demo.queries[q] for q in train} & {demo.queries[q] for q in test}
    assert not {d for q in train.values() for d in q} & {d for q in test.values() for d in q}


def test_the_demos_direct_dp_row_takes_every_unit_in_every_step(demo):
    """The demo's direct DP row is SciFact's rule, whose batch is the whole log (sample rate 1): its expected
    batch is the demo log's number of privacy units."""
    from privret.cli.demo import DEMO_LOG_UNITS, demo_config
    from privret.data.pairs import pairs_from_beir

    from privret.train.dp_run import plan_run

    cfg = demo_config()
    n_units = len(pairs_from_beir(demo, "train").units(cfg.unit))
    assert n_units == DEMO_LOG_UNITS and cfg.direct_dp.methods == ["public-negatives"]
    row = cfg.direct_dp.config("public-negatives", cfg.direct_dp.epsilons[0], cfg.unit)  # the method's checks
    plan = plan_run(row, n_units)
    assert (plan.sample_rate, plan.steps, plan.epsilon) == (1.0, 12, 8.0)
    assert (row.trainable, row.hard_negatives, row.public_negatives, row.dropout) == ("bias-top:3", 2, 1, False)


def test_nicknames_are_private_vocabulary_that_transfers(generator, demo):
    """No document uses a nickname and each names one system by its formal name; each query names
    exactly one system by nickname and its relevant document is an article on that system; each
    system's nicknames occur in both training and test queries."""
    for doc in demo.corpus.values():
        assert sum(s.name in doc.full_text for s in generator.SYSTEMS) == 1, doc.id
        for system in generator.SYSTEMS:
            assert not any(_mentions(doc.full_text, n) for n in system.nicknames), (doc.id, system.name)
    used = {}
    for split in ("train", "test"):
        for qid, relevant in demo.split(split).items():
            named = [s for s in generator.SYSTEMS if any(_mentions(demo.queries[qid], n) for n in s.nicknames)]
            assert len(named) == 1, (qid, demo.queries[qid])
            for doc_id in relevant:
                assert named[0].name in demo.corpus[doc_id].full_text, (qid, doc_id)
            used.setdefault(named[0].name, set()).add(split)
    assert used == {s.name: {"train", "test"} for s in generator.SYSTEMS}


@pytest.mark.integration
def test_public_encoder_does_not_know_the_nicknames(demo):
    """The public encoder (zero-shot) stays far from perfect on the test split: the nicknames hide the
    system. (The gain of training on the log is measured by the demo itself, docs/benchmarks.md.)"""
    from privret.retrieval.metrics import evaluate_retriever
    from privret.models.encoder import load_encoder

    zero = evaluate_retriever(load_encoder("minilm-l6"), demo.corpus, demo.queries, demo.split("test"))
    assert zero["ndcg@10"] < 0.55
