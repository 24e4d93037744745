"""Fed-SQuAD builder rules on a tiny hand-made SQuAD-format file."""

from __future__ import annotations

import json

import pytest

from privret.data.fed_squad import build_fed_squad, client_sizes, load_fed_squad, split_sentences
from privret.errors import InputError


def _texts(text):
    return [text[s:e] for s, e in split_sentences(text)]


def test_sentence_splitter_keeps_abbreviations_and_initials():
    assert _texts("Dr. Smith studied the fox. She wrote a book.") == ["Dr. Smith studied the fox.",
                                                                    "She wrote a book."]
    assert _texts("J. R. R. Tolkien wrote it in the U.S. He was British.") == [
        "J. R. R. Tolkien wrote it in the U.S. He was British."]  # "U.S." is kept whole (abbreviation)
    assert _texts('He said "Stop." Then he left! Why? 1990 was late.') == [
        'He said "Stop."', "Then he left!", "Why?", "1990 was late."]
    assert _texts("version 2.5 is out. ok") == ["version 2.5 is out. ok"]  # no capital after the dot


def test_client_sizes_are_unequal_and_cover_everything():
    sizes = client_sizes(40, 10)
    assert sizes == [1, 1, 2, 3, 4, 4, 5, 6, 7, 7]
    assert client_sizes(3, 2) == [1, 2]
    with pytest.raises(InputError, match="at least one article per client") as err:
        client_sizes(3, 4)
    assert err.value.field == "n_clients"


def _questions(root):
    return {q.id: (c, q) for c in load_fed_squad(root) for q in c.questions}


def test_answer_sentence_rules(tiny_squad, tmp_path):
    manifest = build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2, seed=0)
    qs = _questions(tmp_path / "fed")
    assert manifest["dropped_questions"] == 1 and "a6" not in qs  # "purple cat" is nowhere in its paragraph

    def text(qid, sid):
        c, _ = qs[qid]
        return c.sentences[c.sentence_ids.index(sid)]

    c, q = qs["a1"]
    assert [text("a1", s) for s in q.answer_sentences] == ["It eats mice and berries."]
    _, q = qs["a4"]
    assert text("a4", q.positive) == "Dr. Smith studied the fox."
    # an answer spanning a sentence break: both sentences are relevant, the positive is the first
    _, q = qs["a5"]
    assert [text("a5", s) for s in q.answer_sentences] == ["She wrote a book.", "The book won a prize."]
    assert text("a5", q.positive) == "She wrote a book."
    # votes: "The Nile" (case-sensitive) only in sentence 2, "Nile" in 2 and 3 -> sentence 2 wins
    _, q = qs["b1"]
    assert [text("b1", s) for s in q.answer_sentences] == ["The Nile is a long river."]
    # passages are the paragraphs; every sentence belongs to its passage
    c, q = qs["b3"]
    assert c.passages[q.passage_id] == [s for s, p in zip(c.sentence_ids, c.sentence_passage) if p == q.passage_id]


def test_grouping_and_splits_are_deterministic(tiny_squad, tiny_squad_obj, tmp_path):
    m1 = build_fed_squad(tiny_squad, tmp_path / "a", n_clients=2, seed=0)
    shuffled = dict(tiny_squad_obj, data=list(reversed(tiny_squad_obj["data"])))
    other = tmp_path / "reversed.json"
    other.write_text(json.dumps(shuffled))
    m2 = build_fed_squad(other, tmp_path / "b", n_clients=2, seed=0)
    assert [c["articles"] for c in m1["clients"]] == [c["articles"] for c in m2["clients"]]
    assert [len(c["articles"]) for c in m1["clients"]] == [1, 2]
    for c in m1["clients"]:
        assert c["train_questions"] >= 1 and c["test_questions"] >= 1
    for name in ("client_00", "client_01"):
        assert (tmp_path / "a" / name / "questions.jsonl").read_text() == \
            (tmp_path / "b" / name / "questions.jsonl").read_text()


def test_bad_input_is_one_error_and_nothing_written(tiny_squad_obj, tmp_path):
    bad = tiny_squad_obj
    del bad["data"][1]["paragraphs"][0]["context"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError) as err:
        build_fed_squad(path, tmp_path / "out", n_clients=2)
    assert err.value.field == "data[1].paragraphs[0].context"
    assert not (tmp_path / "out").exists()
    path.write_text('{"data": [')
    with pytest.raises(InputError) as err:
        build_fed_squad(path, tmp_path / "out", n_clients=2)
    assert err.value.line == 1 and not (tmp_path / "out").exists()


def test_cli_data_fed_squad(tiny_squad, tmp_path):
    from typer.testing import CliRunner

    from privret.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["data", "fed-squad", "--squad", str(tiny_squad), "--out", str(tmp_path / "fed"),
                              "--clients", "2"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "fed" / "manifest.json").is_file()
    res = runner.invoke(app, ["data", "fed-squad", "--squad", str(tmp_path / "nope.json"), "--out",
                              str(tmp_path / "fed2")])
    assert res.exit_code != 0 and not (tmp_path / "fed2").exists()


@pytest.mark.parametrize("field", ["positive", "answer_sentences"])
def test_an_unknown_sentence_is_blamed_on_the_field_that_names_it(tiny_squad, tmp_path, field):
    from privret.data.fed_squad import load_client

    build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2)
    questions = tmp_path / "fed" / "client_00" / "questions.jsonl"
    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    rows[1][field] = "no-such-sentence" if field == "positive" else ["no-such-sentence"]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match="unknown sentence 'no-such-sentence'") as err:
        load_client(tmp_path / "fed" / "client_00")
    assert (err.value.line, err.value.field) == (2, field)


@pytest.mark.parametrize("name", ["passages.jsonl", "sentences.jsonl", "questions.jsonl"])
def test_an_id_given_twice_in_a_client_file_is_refused_at_its_line(tiny_squad, tmp_path, name):
    """A repeated id would merge two questions' metrics (or two passages, two sentences) silently."""
    from privret.data.fed_squad import load_client

    build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2)
    path = tmp_path / "fed" / "client_01" / name
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) >= 2, rows
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, rows[0]]))
    with pytest.raises(InputError, match=f"duplicate id '{rows[0]['id']}' \\(first on line 1\\)") as err:
        load_client(tmp_path / "fed" / "client_01")
    assert (err.value.path, err.value.line, err.value.field) == (str(path), len(rows) + 1, "id")


def test_a_question_id_given_twice_in_the_squad_file_is_refused(tiny_squad, tmp_path):
    """SQuAD's question ids key each question's split and relevance in every dataset built from the file."""
    from privret.data.fed_squad import load_squad

    squad = json.loads(tiny_squad.read_text())
    first = squad["data"][0]["paragraphs"][0]["qas"][0]
    last_paragraph = squad["data"][-1]["paragraphs"][-1]
    last_paragraph["qas"].append({**first, "question": "Another question?"})
    tiny_squad.write_text(json.dumps(squad))
    a, p, q = len(squad["data"]) - 1, len(squad["data"][-1]["paragraphs"]) - 1, len(last_paragraph["qas"]) - 1
    with pytest.raises(InputError, match=f"duplicate question id '{first['id']}'") as err:
        load_squad(tiny_squad)
    assert err.value.field == f"data[{a}].paragraphs[{p}].qas[{q}].id"


def test_cli_federated_train_bm25_and_bad_config(tiny_squad, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from privret.cli import app
    from privret.errors import InputError

    runner = CliRunner()
    assert runner.invoke(app, ["data", "fed-squad", "--squad", str(tiny_squad), "--out", str(tmp_path / "fed"),
                               "--clients", "2"]).exit_code == 0
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r"),
                              "--baseline", "bm25"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r" / "bm25.json").is_file()
    # the result names its data by a keyed commitment, never by a bare digest of the clients' (private) files
    from privret.io import file_sha256
    from privret.privacy.commitment import is_committed

    saved = json.loads((tmp_path / "r" / "bm25.json").read_text())
    files = sorted(p for p in (tmp_path / "fed").rglob("*") if p.is_file())
    assert is_committed(saved["data_hash"]) and file_sha256(*files) not in (tmp_path / "r" / "bm25.json").read_text()
    # resumed, a baseline's saved result of the same settings and data is reused; other settings or
    # --no-resume run it again
    from privret.federated import runner as fed_runner

    def fails(*_args):
        raise RuntimeError("trained again")

    monkeypatch.setitem(fed_runner.BASELINES, "bm25", fails)
    base = ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r"), "--baseline", "bm25"]
    res = runner.invoke(app, [*base, "--threads", "2"])
    assert res.exit_code == 0 and "sentence MRR@10" in res.output, res.output
    for extra in (["--no-resume"], ["--rounds", "7"]):
        res = runner.invoke(app, [*base, *extra])
        assert isinstance(res.exception, RuntimeError), (extra, res.output)
    (tmp_path / "fed" / "notes.txt").write_text("another file: other data")
    assert isinstance(runner.invoke(app, base).exception, RuntimeError)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: 2\nnum_roundz: 3\n")
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r2"),
                              "--config", str(bad)])
    assert isinstance(res.exception, InputError) and res.exception.field == "num_roundz"
    bad.write_text("rounds: -2\n")  # a bad value from the file is named by the file and its field, not a flag
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r2"),
                              "--config", str(bad)])
    assert isinstance(res.exception, InputError) and (res.exception.path, res.exception.field) == (str(bad), "rounds")
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r2"),
                              "--config", str(bad), "--rounds", "-3"])  # the flag given over it is what is wrong
    assert isinstance(res.exception, InputError) and res.exception.field == "--rounds" and res.exception.path is None
    bad.write_text("rounds: 2\nrounds: 3\n")  # the same YAML reading as a pipeline config: a key twice is refused
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r2"),
                              "--config", str(bad)])
    assert isinstance(res.exception, InputError) and "key 'rounds' given twice" in str(res.exception)
    assert res.exception.line == 2 and not (tmp_path / "r2").exists()
    bad.write_text("dp: none\ndp_clip_norm: 2\n")  # an error of the file's fields together: named by the file
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r2"),
                              "--config", str(bad)])
    assert isinstance(res.exception, InputError) and res.exception.path == str(bad), res.output
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r3"),
                              "--baseline", "bm25", "--epsilon", "8"])
    assert isinstance(res.exception, InputError) and res.exception.field == "--epsilon"
    assert not (tmp_path / "r3").exists()
    # the baselines train without DP: a DP setting for them, by flag or in the config, is refused
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r3"),
                              "--baseline", "local-only", "--dp", "server"])
    assert isinstance(res.exception, InputError) and res.exception.field == "--dp"
    assert "without DP" in res.exception.message
    dp_config = tmp_path / "dp.yaml"
    dp_config.write_text("dp: client\n")
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r3"),
                              "--baseline", "central", "--config", str(dp_config)])
    assert isinstance(res.exception, InputError) and res.exception.field == "dp"
    assert str(res.exception.path) == str(dp_config)
    assert not (tmp_path / "r3").exists()
    # a target epsilon sets the noise multiplier: one given beside it would be silently overridden, so it is refused
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r3"),
                              "--dp", "server", "--epsilon", "8", "--noise-multiplier", "0.5"])
    assert isinstance(res.exception, InputError) and "give one of them" in res.exception.message
    assert not (tmp_path / "r3").exists()
    res = runner.invoke(app, ["federated", "train", "--data", str(tmp_path / "fed"), "--out", str(tmp_path / "r4"),
                              "--baseline", "bm25", "--wire-dtype", "float8"])
    assert res.exit_code == 2 and "'float8' is not one of" in res.output and not (tmp_path / "r4").exists()


def test_cli_federated_train_on_the_validation_split_at_a_learning_rate(tiny_squad, tiny_encoder, tmp_path):
    from typer.testing import CliRunner

    from privret.cli import app
    from privret.data.fed_squad import load_fed_squad
    from privret.errors import InputError
    from privret.federated import local
    from privret.settings.federated import FedConfig

    runner = CliRunner()
    fed = tmp_path / "fed"
    assert runner.invoke(app, ["data", "fed-squad", "--squad", str(tiny_squad), "--out", str(fed),
                               "--clients", "2"]).exit_code == 0
    res = runner.invoke(app, ["federated", "train", "--data", str(fed), "--out", str(tmp_path / "r"), "--baseline",
                              "zero-shot", "--model", tiny_encoder, "--train-fraction", "0.5", "--eval-split",
                              "validation", "--lr", "1e-3"])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "r" / "zero-shot.json").read_text())
    cfg = FedConfig(**saved["config"])
    assert cfg.learning_rate == 1e-3 and cfg.evaluation_split == "validation"
    for c in load_fed_squad(fed):
        held_out = len(c.split("train")) - len(local.train_questions(c, 0, 0, 0.5))
        assert saved["per_client"][c.name]["sentence"]["queries"] == held_out
    res = runner.invoke(app, ["federated", "train", "--data", str(fed), "--out", str(tmp_path / "r2"), "--baseline",
                              "zero-shot", "--eval-split", "validation"])
    assert isinstance(res.exception, InputError) and "train_fraction" in str(res.exception)
    assert not (tmp_path / "r2").exists()
