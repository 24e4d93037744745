"""BEIR and pairs parsing: every kind of bad input gives one located InputError; units group rows."""

from __future__ import annotations

import json

import pytest

from privret.data.beir import load_beir, write_beir
from privret.data.pairs import PrivacyUnit, QueryDocPair, group_units, load_pairs_jsonl, pairs_from_beir
from privret.errors import InputError


def test_load_toy_dataset(toy_beir):
    ds = load_beir(toy_beir)
    assert len(ds.corpus) == 6 and set(ds.qrels) == {"train", "test"}
    pairs = pairs_from_beir(ds, "train")
    assert len(pairs.pairs) == 6  # q3 has two relevant documents
    assert [len(u) for u in pairs.units("query")] == [1, 1, 2, 1, 1]
    assert len(pairs.units("pair")) == 6


@pytest.mark.parametrize("line, field, message", [
    ('{"_id": "d1", "title": "t", "text": "x"\n', None, "malformed JSON"),
    ('{"_id": "d7", "title": "t"}\n', "text", "missing"),
    ('{"_id": "d7", "title": "t", "text": "   "}\n', "text", "empty"),
    ('{"_id": "d7", "title": "t", "text": ["x"]}\n', "text", "expected a string"),
    ('{"_id": "d1", "title": "t", "text": "again"}\n', "_id", "duplicate document id"),
    ('["not", "an", "object"]\n', None, "expected a JSON object"),
])
def test_corpus_errors_name_file_line_field(toy_beir, line, field, message):
    corpus = toy_beir / "corpus.jsonl"
    corpus.write_text(corpus.read_text() + line)
    with pytest.raises(InputError) as err:
        load_beir(toy_beir)
    assert err.value.path == str(corpus) and err.value.line == 7 and err.value.field == field
    assert message in err.value.one_line() and "\n" not in err.value.one_line()


def test_an_empty_queries_file_is_named(toy_beir):
    """Named as an empty queries file, not as the first qrels line's unknown query id."""
    (toy_beir / "queries.jsonl").write_text("")
    with pytest.raises(InputError, match="queries file is empty") as err:
        load_beir(toy_beir)
    assert err.value.path == str(toy_beir / "queries.jsonl")


def test_duplicate_ids(toy_beir):
    queries = toy_beir / "queries.jsonl"
    queries.write_text(queries.read_text() + json.dumps({"_id": "q1", "text": "again"}) + "\n")
    with pytest.raises(InputError, match="duplicate query id 'q1'") as err:
        load_beir(toy_beir)
    assert err.value.line == 8 and err.value.field == "_id"


@pytest.mark.parametrize("row, field", [("q404\td1\t1", "query-id"), ("q1\td404\t1", "corpus-id"),
                                        ("q1\td2\tone", "score")])
def test_qrels_unknown_ids_and_bad_scores(toy_beir, row, field):
    qrels = toy_beir / "qrels" / "train.tsv"
    qrels.write_text(qrels.read_text() + row + "\n")
    with pytest.raises(InputError) as err:
        load_beir(toy_beir)
    assert err.value.field == field and err.value.line == 8


@pytest.mark.parametrize("rows", ["", "query-id\tcorpus-id\tscore\n", "q1\td1\t0\n"])
def test_a_split_with_no_positive_judgement_is_refused_where_it_is_used(toy_beir, rows):
    """An empty, header-only or all-zero qrels file loads (data validate lists it), but training or scoring on it
    names the file, where it would otherwise end in a ValueError from the metrics (or an NDCG of 0 on every query)."""
    (toy_beir / "qrels" / "test.tsv").write_text(rows)
    dataset = load_beir(toy_beir)
    assert dataset.split("train")  # the other split is untouched
    with pytest.raises(InputError, match="no positive judgement in this split") as err:
        dataset.split("test")
    assert err.value.path == str(toy_beir / "qrels" / "test.tsv")


def test_non_utf8_bytes(toy_beir):
    corpus = toy_beir / "corpus.jsonl"
    corpus.write_bytes(corpus.read_bytes() + b'{"_id": "d9", "text": "caf\xe9"}\n')
    with pytest.raises(InputError, match="not valid UTF-8") as err:
        load_beir(toy_beir)
    assert err.value.line == 7


def test_write_beir_roundtrip_and_no_partial_output(toy_beir, tmp_path, monkeypatch):
    ds = load_beir(toy_beir)
    write_beir(tmp_path / "copy", ds, manifest={"note": "x"})
    again = load_beir(tmp_path / "copy")
    assert again.corpus == ds.corpus and again.queries == ds.queries and again.qrels == ds.qrels
    # a crash after the data files but before the manifest leaves no target and no temporary directory
    import privret.data.beir as beir

    def crash(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(beir, "write_json_atomic", crash)
    with pytest.raises(RuntimeError):
        write_beir(tmp_path / "broken", ds, manifest={"note": "x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "toy"]  # no "broken", no ".broken.*.tmp"


def test_pairs_jsonl_both_forms_and_units(tmp_path, toy_beir):
    ds = load_beir(toy_beir)
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"query": "aspirin heart", "doc_id": "d1", "user_id": "u1"},
        {"query": "aspirin heart", "doc_id": "d5", "user_id": "u2"},
        {"query": "tea and sleep", "doc": "a new inline document about tea", "user_id": "u1"},
    ]) + "\n")
    tp = load_pairs_jsonl(path, ds.corpus)
    assert len(tp.pairs) == 3 and tp.pairs[2].doc_id in tp.corpus
    assert tp.inline_doc_ids == {tp.pairs[2].doc_id}  # private: the public corpus's d1, d5 are not listed
    assert tp.units("query") == [[0, 1], [2]]
    assert tp.units("user") == [[0, 2], [1]]
    assert tp.units("pair") == [[0], [1], [2]]


def test_pairs_errors(tmp_path, toy_beir):
    corpus = load_beir(toy_beir).corpus
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"query": "x", "doc_id": "nope"}) + "\n")
    with pytest.raises(InputError, match="unknown document id") as err:
        load_pairs_jsonl(path, corpus)
    assert (err.value.line, err.value.field) == (1, "doc_id")
    with pytest.raises(InputError, match="names document 'nope' by id, and no corpus was given") as err:
        load_pairs_jsonl(path)  # not "unknown": there was nothing to look it up in
    assert (err.value.line, err.value.field) == (1, "doc_id")
    path.write_text(json.dumps({"query": "x"}) + "\n")
    with pytest.raises(InputError, match="need 'doc_id' or 'doc'"):
        load_pairs_jsonl(path, corpus)


def test_query_units_are_distinct_texts_not_ids():
    pairs = [QueryDocPair("a", "d1", "q1"), QueryDocPair("b", "d2", "q1"), QueryDocPair("b", "d3", "q9"),
             QueryDocPair("c", "d4", "q4"), QueryDocPair("a", "d5", "q7")]
    # one unit per distinct text: ids are not used (merging by id would make a removal a substitution)
    assert group_units(pairs, PrivacyUnit.query) == [[0, 4], [1, 2], [3]]
    # removing every row of one text removes exactly one unit and leaves the others unchanged
    rest = [p for p in pairs if p.query != "b"]
    assert [[rest[i] for i in u] for u in group_units(rest, PrivacyUnit.query)] == [
        [pairs[i] for i in u] for u in group_units(pairs, PrivacyUnit.query) if pairs[u[0]].query != "b"]


def test_user_unit_requires_user_ids_and_names_the_line_without_one(tmp_path):
    with pytest.raises(InputError, match="these pairs carry none") as err:
        group_units([QueryDocPair("a", "d1")], PrivacyUnit.user)
    assert err.value.field == "user_id"
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"query": "a", "doc": "x", "user_id": "u1"}\n\n{"query": "b", "doc": "y"}\n')
    pairs = load_pairs_jsonl(path)
    with pytest.raises(InputError) as err:
        pairs.units("user")
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 3, "user_id")
    # where a pair was read is not part of it: the same pair read from another line is equal, and groups alike
    assert pairs.pairs[1] == QueryDocPair("b", pairs.pairs[1].doc_id)
    assert pairs.units("query") == [[0], [1]]


def test_a_document_list_names_the_line_of_an_unknown_or_repeated_id(tmp_path):
    from privret.data.beir import Document
    from privret.synth.documents import read_document_ids

    corpus = {d: Document(d, "", f"text {d}") for d in ("d1", "d2", "d3")}
    path = tmp_path / "ids.txt"
    path.write_text("d2\n\nd1\n")
    assert read_document_ids(path, corpus) == ["d2", "d1"]  # the list's order, blank lines skipped
    path.write_text("d2\n\nd1\nd2\n")
    with pytest.raises(InputError, match=r"document id 'd2' given twice \(first on line 1\)") as err:
        read_document_ids(path, corpus)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 4, "doc_id")
    path.write_text("d1\nd9\n")
    with pytest.raises(InputError, match="unknown document id 'd9'") as err:
        read_document_ids(path, corpus)
    assert (err.value.line, err.value.field) == (2, "doc_id")


def test_data_validate_checks_a_pairs_files_document_ids_against_corpus(tmp_path, toy_beir):
    from helpers import run_cli

    known = next(iter(load_beir(toy_beir).corpus))
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"query": "x", "doc_id": known}) + "\n" + json.dumps({"query": "y", "doc_id": "nope"})
                    + "\n")
    for corpus in (toy_beir, toy_beir / "corpus.jsonl"):
        result = run_cli("data", "validate", str(path), "--corpus", str(corpus))
        assert result.returncode == 2 and f"{path}:2, field 'doc_id': unknown document id 'nope'" in result.stderr
    path.write_text(json.dumps({"query": "x", "doc_id": known}) + "\n")
    result = run_cli("data", "validate", str(path), "--corpus", str(toy_beir))
    assert result.returncode == 0 and "ok: 1 pairs, 1 query units" in result.stdout, result.stderr
    result = run_cli("data", "validate", str(path))
    assert result.returncode == 2 and "no corpus was given" in result.stderr
    result = run_cli("data", "validate", str(toy_beir), "--corpus", str(toy_beir))
    assert result.returncode == 2 and "field '--corpus': applies to a pairs file only" in result.stderr
