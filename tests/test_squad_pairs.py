"""Public pairs from SQuAD (privret data squad-pairs): the input of the epsilon = 0 rows."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from helpers import run_cli
from test_squad_beir import _squad, _write
from privret.cli import app
from privret.data.pairs import load_pairs_jsonl
from privret.data.squad_pairs import squad_public_pairs
from privret.errors import InputError


def _questions_by_paragraph(squad: dict) -> dict[str, list[str]]:
    return {par["context"]: [qa["question"] for qa in par["qas"] if not qa.get("is_impossible")]
            for art in squad["data"] for par in art["paragraphs"]}


def test_every_paragraph_once_with_one_of_its_own_questions(tmp_path):
    squad = _squad(6)
    rows = squad_public_pairs(_write(tmp_path, squad))
    own = _questions_by_paragraph(squad)
    assert [r["doc"] for r in rows] == list(own)  # all paragraphs, file order, each once
    assert all(r["query"] in own[r["doc"]] for r in rows)


def test_sample_is_seeded_without_replacement_and_skips_unanswerable(tmp_path):
    squad = _squad(8)
    squad["data"][0]["paragraphs"][0]["qas"] = [dict(qa, is_impossible=True)
                                                for qa in squad["data"][0]["paragraphs"][0]["qas"]]
    path = _write(tmp_path, squad)
    own = _questions_by_paragraph(squad)
    answerable = [doc for doc, questions in own.items() if questions]
    assert len(answerable) == len(own) - 1
    draws = {seed: squad_public_pairs(path, paragraphs=5, seed=seed) for seed in range(6)}
    assert draws[0] == squad_public_pairs(path, paragraphs=5, seed=0)
    assert len({json.dumps(rows) for rows in draws.values()}) > 1  # the seed changes the draw
    for rows in draws.values():
        docs = [r["doc"] for r in rows]
        assert len(docs) == 5 == len(set(docs)) and set(docs) <= set(answerable)
        assert all(r["query"] in own[r["doc"]] for r in rows)
    with pytest.raises(InputError, match="paragraphs"):
        squad_public_pairs(path, paragraphs=len(answerable) + 1)


def test_cli_writes_a_pairs_file_the_generator_reads(tmp_path):
    path = _write(tmp_path, _squad(5))
    out = tmp_path / "pairs.jsonl"
    res = CliRunner().invoke(app, ["data", "squad-pairs", "--squad", str(path), "--out", str(out),
                                   "--paragraphs", "4", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "4 public pairs" in res.output
    pairs = load_pairs_jsonl(out)
    assert len(pairs.pairs) == 4 == len(pairs.inline_doc_ids)
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == \
        squad_public_pairs(path, paragraphs=4, seed=3)


def test_cli_bad_squad_file_is_one_line_naming_the_field_and_writes_nothing(tmp_path):
    bad = _squad(3)
    del bad["data"][1]["paragraphs"][0]["context"]
    out = tmp_path / "pairs.jsonl"
    res = run_cli("data", "squad-pairs", "--squad", str(_write(tmp_path, bad)), "--out", str(out))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "squad.json, field 'data[1].paragraphs[0].context'" in res.stderr
    assert not out.exists() and not list(tmp_path.glob(".pairs.jsonl*"))
