"""bench/per_unit_objectives.py: the article carve and the log it writes for replaying a run in the DP trainer."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import load_script
from privret.data.beir import load_beir

per_unit = load_script("bench/per_unit_objectives.py")


def _beir(root: Path, articles: int, per_article: int) -> Path:
    """A BEIR directory in ``privret data squad-beir``'s naming: one paragraph per article, ``<article>-0``."""
    (root / "qrels").mkdir(parents=True)
    docs = [f"a{a}-0" for a in range(articles)]
    with open(root / "corpus.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"_id": d, "title": "", "text": f"paragraph {d}"}) + "\n")
    qids = [(f"q{a}-{i}", docs[a]) for a in range(articles) for i in range(per_article)]
    with open(root / "queries.jsonl", "w") as f:
        for q, _ in qids:
            f.write(json.dumps({"_id": q, "text": f"question {q}"}) + "\n")
    rows = "".join(f"{q}\t{d}\t1\n" for q, d in qids)
    for split in ("train", "validation", "test"):
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows)
    (root / "manifest.json").write_text("{}")
    return root


def test_the_carve_holds_out_whole_articles_and_samples_the_rest(tmp_path):
    ds = load_beir(_beir(tmp_path / "full", articles=6, per_article=5), ["train"])
    units, validation = per_unit.carve(ds, 2, 7, seed=0)
    held = {q.split("-")[0] for q in validation}
    assert len(held) == 2 and len(validation) == 10
    assert len(units) == 7 and not {q.split("-")[0] for q, _ in units} & held
    assert all(gold == [f"a{q[1:].split('-')[0]}-0"] for q, gold in units)
    assert per_unit.carve(ds, 2, 7, seed=0)[0] == units and per_unit.carve(ds, 2, 7, seed=1)[0] != units


def test_the_written_log_trains_on_the_units_alone(tmp_path):
    base = _beir(tmp_path / "base", articles=6, per_article=5)
    units, _ = per_unit.carve(load_beir(base, ["train"]), 2, 7, seed=0)
    n = per_unit.write_log(units, base, tmp_path / "log")
    log = load_beir(tmp_path / "log")
    assert n == 7 and set(log.split("train")) == {q for q, _ in units}
    assert log.split("test") == load_beir(base).split("test") and len(log.corpus) == 6
    assert (tmp_path / "log" / "corpus.jsonl").is_symlink() and not (tmp_path / "log" / "qrels" / "train.tsv.tmp").exists()
    assert per_unit.write_log(units, base, tmp_path / "log") == 7  # a second write over the first
