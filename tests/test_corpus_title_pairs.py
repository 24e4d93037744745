"""bench/corpus_title_pairs.py: public (title -> body) pairs from a BEIR corpus, readable as a privret pairs file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from privret.data.pairs import inline_doc_id, load_pairs_jsonl

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "corpus_title_pairs.py"


def test_each_titled_document_gives_its_title_and_body_alone(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    docs = [{"_id": "a", "title": "Aspirin lowers fever.", "text": "We gave aspirin to 40 patients."},
            {"_id": "b", "title": "", "text": "A document without a title."},
            {"_id": "c", "title": "Ünïcode kept", "text": "  Body with spaces around.  "}]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    out = tmp_path / "pairs.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), str(corpus), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == [
        {"query": "Aspirin lowers fever.", "doc": "We gave aspirin to 40 patients."},
        {"query": "Ünïcode kept", "doc": "Body with spaces around."}]
    pairs = load_pairs_jsonl(out)  # what `privret retriever train --pairs` reads
    assert [p.query for p in pairs.pairs] == ["Aspirin lowers fever.", "Ünïcode kept"]
    assert pairs.pairs[0].doc_id == inline_doc_id("We gave aspirin to 40 patients.")
    assert "Aspirin lowers fever." not in pairs.corpus[pairs.pairs[0].doc_id].full_text  # the title is not in its document
    assert "2 pairs of 3 documents" in done.stdout


def test_a_bad_corpus_line_is_one_clear_error_and_nothing_written(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "title": "T", "text": "body"}) + "\n"
                      + json.dumps({"_id": "b", "title": "T", "text": ""}) + "\n")
    out = tmp_path / "pairs.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), str(corpus), str(out)], capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [f"error: {corpus}:2, field 'text': empty"]
    assert not out.exists()
