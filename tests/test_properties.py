"""Property-based tests (hypothesis) of every parser and config loader, and of the CLI's numeric flags.

Each input, however malformed (random bytes, truncated or non-UTF-8 files, adversarial JSON/YAML,
huge or deeply nested values, NaN/inf/negative/absurd numbers, path traversal), must end in either
a valid result or an :class:`InputError` (the CLI: exit 2 with one line), never another exception,
and never take long. The number of inputs tried per family is counted; with
``PRIVRET_PROPERTY_REPORT=FILE`` the counts are written there (docs/reliability.md quotes them).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from privret.data.beir import Document, load_beir, load_corpus, load_qrels, load_queries
from privret.data.pairs import load_pairs_jsonl
from privret.errors import InputError

TRIED: Counter = Counter()
HANDLED: Counter = Counter()
SLOW_S = 30.0  # longer than this on one input counts as a hang (generous: the machine is shared)
SETTINGS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)
field_names = st.sampled_from(["_id", "title", "text", "query", "doc_id", "doc", "user_id", "query_id", "x", ""])
records = st.dictionaries(field_names, json_values, max_size=5)


def _line(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def jsonl_files(draw) -> bytes:
    """Lines of random records, mixed with raw garbage, invalid UTF-8 and truncation."""
    lines = draw(st.lists(st.one_of(records.map(_line), json_values.map(_line), st.binary(max_size=40),
                                    st.sampled_from([b"\xff\xfe", b"\xc3", b"{", b"[]", b"null", b"   ", b"\x00"])),
                          max_size=8))
    data = b"\n".join(lines)
    if data and draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]  # truncated mid-line
    return data


HUGE_LINE = b'{"_id": "d1", "text": "' + b"a" * 3_000_000 + b'"}'
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"_id": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b', "text": "x"}'
MANY_BLANK = b"\n" * 200_000


def _outcome(family: str, fn) -> object:
    """Run ``fn``; record the outcome. Only a result or an InputError is acceptable."""
    TRIED[family] += 1
    started = time.perf_counter()
    try:
        result = fn()
        outcome = "ok"
    except InputError as err:
        assert err.one_line() and "\n" not in err.one_line()
        result, outcome = err, "input-error"
    elapsed = time.perf_counter() - started
    assert elapsed < SLOW_S, f"{family}: {elapsed:.1f} s"
    HANDLED[family] += 1
    return result if outcome == "ok" else None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("props")


@SETTINGS
@given(data=jsonl_files())
@example(data=HUGE_LINE)
@example(data=DEEP_JSON)
@example(data=DEEP_OBJECT)
@example(data=MANY_BLANK)
@example(data=b"")
@example(data=b'{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}')
def test_corpus_and_queries_files(scratch, data):
    path = scratch / "corpus.jsonl"
    path.write_bytes(data)
    corpus = _outcome("BEIR corpus.jsonl", lambda: load_corpus(path))
    if corpus is not None:
        assert corpus and all(isinstance(d, Document) and d.text.strip() for d in corpus.values())
    queries = _outcome("BEIR queries.jsonl", lambda: load_queries(path))
    if queries is not None:
        assert all(isinstance(q, str) and q.strip() for q in queries.values())


@st.composite
def qrels_files(draw) -> bytes:
    cell = st.one_of(st.sampled_from(["q1", "q2", "d1", "d2", "1", "0", "-3", "1.5", "nan", "", " ", "9" * 40]),
                     st.text(max_size=6))
    rows = draw(st.lists(st.lists(cell, min_size=0, max_size=5).map("\t".join), max_size=8))
    if draw(st.booleans()):
        rows.insert(0, "query-id\tcorpus-id\tscore")
    data = "\n".join(rows).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        data += draw(st.binary(max_size=10))
    return data


@SETTINGS
@given(data=qrels_files())
@example(data=b"query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t1\n")
@example(data=b"q1\td1\t" + b"9" * 5000)
def test_qrels_files(scratch, data):
    path = scratch / "test.tsv"
    path.write_bytes(data)
    corpus = {"d1": Document("d1", "", "x"), "d2": Document("d2", "", "y")}
    qrels = _outcome("BEIR qrels TSV", lambda: load_qrels(path, corpus=corpus, queries={"q1": "a", "q2": "b"}))
    if qrels is not None:
        assert all(d in corpus for docs in qrels.values() for d in docs)


@SETTINGS
@given(corpus=jsonl_files(), queries=jsonl_files(), qrels=qrels_files(),
       missing=st.sets(st.sampled_from(["corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels"])))
def test_beir_directories(scratch, corpus, queries, qrels, missing):
    import shutil

    root = scratch / "beir"
    shutil.rmtree(root, ignore_errors=True)
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_bytes(corpus)
    (root / "queries.jsonl").write_bytes(queries)
    (root / "qrels" / "test.tsv").write_bytes(qrels)
    for name in missing:
        target = root / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    _outcome("BEIR directory", lambda: load_beir(root, splits=["test"]))


@SETTINGS
@given(data=jsonl_files())
@example(data=b'{"query": "q", "doc_id": "nope"}')
@example(data=b'{"query": "q", "doc": "d", "user_id": ["list"]}')
@example(data=DEEP_JSON)
def test_pairs_jsonl(scratch, data):
    path = scratch / "pairs.jsonl"
    path.write_bytes(data)
    corpus = {"d1": Document("d1", "", "x")}
    pairs = _outcome("pairs JSONL", lambda: load_pairs_jsonl(path, corpus))
    if pairs is not None:
        assert pairs.pairs and all(p.doc_id in pairs.corpus for p in pairs.pairs)
        assert pairs.inline_doc_ids == set(pairs.corpus) - {"d1"}  # whatever came inline, never the given d1


# --- pipeline YAML --------------------------------------------------------------------------------

absurd_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10 ** 40), 10 ** 40),
                           st.sampled_from([0, -1, 1e308, -1e-308, 1e-300, 2 ** 63, "nan", ".inf", "-.inf", "1e999"]))
adversarial_paths = st.sampled_from(["../../../../etc/passwd", "/etc", "..", "~root", "a/../../b", "\x00bad",
                                     "runs/../../escape", "C:\\Windows", "%2e%2e/x", "", " ", "ok-name"])
config_fields = {
    "name": st.one_of(adversarial_paths, st.text(max_size=12), absurd_numbers),
    "dataset": st.one_of(adversarial_paths, st.text(max_size=12), st.none()),
    "epsilons": st.one_of(st.lists(absurd_numbers, max_size=4), absurd_numbers, st.text(max_size=5)),
    "unit": st.sampled_from(["query", "pair", "user", "row", 3, None]),
    "train_split": st.one_of(adversarial_paths, st.text(max_size=6)),
    "synthetic_documents": st.sampled_from(["training", "corpus", "all", 1, {"source": "list"},
                                            {"source": "dp-select", "sample": 0, "selection": {"epsilon": -1}},
                                            {"source": "corpus", "ids_file": "x"}]),
    "generator": st.dictionaries(st.sampled_from(["batch_size", "epochs", "learning_rate", "clip_norm", "delta",
                                                  "lora_rank", "max_doc_tokens", "model", "trainable", "unknown",
                                                  "checkpoint_every", "secure_rng"]), absurd_numbers, max_size=4),
    "generate": st.dictionaries(st.sampled_from(["num_queries", "top_p", "temperature", "batch_size", "seed"]),
                                absurd_numbers, max_size=3),
    "retriever": st.dictionaries(st.sampled_from(["epochs", "batch_size", "learning_rate", "temperature",
                                                  "warmup_fraction"]), absurd_numbers, max_size=3),
    "surprise": json_values,
}


@st.composite
def pipeline_yaml(draw) -> bytes:
    kind = draw(st.sampled_from(["structured", "structured", "structured", "raw", "truncated"]))
    if kind == "raw":
        return draw(st.binary(max_size=200))
    mapping = {"name": "ok", "dataset": "data", "epsilons": [1.0]}
    for key in draw(st.sets(st.sampled_from(sorted(config_fields)), max_size=4)):
        mapping[key] = draw(config_fields[key])
    for key in draw(st.sets(st.sampled_from(["name", "dataset", "epsilons"]), max_size=2)):
        mapping.pop(key, None)
    text = yaml.safe_dump(mapping, allow_unicode=True)
    # YAML spellings of special floats that safe_dump would quote
    text = text.replace("'.inf'", ".inf").replace("'nan'", ".nan").replace("'-.inf'", "-.inf")
    data = text.encode("utf-8", "surrogatepass")
    if kind == "truncated" and data:
        data = data[: draw(st.integers(0, len(data)))]
    return data


BILLION_LAUGHS = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                  "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
                  "name: x\ndataset: d\nepsilons: *f\n").encode()


@SETTINGS
@given(data=pipeline_yaml())
@example(data=BILLION_LAUGHS)
@example(data=b"[" * 20_000 + b"]" * 20_000)
@example(data=b"name: x\ndataset: d\nepsilons: [1]\n" + b"# pad\n" * 300_000)
@example(data=b"name: ../../escape\ndataset: d\nepsilons: [1]\n")
@example(data=b"name: /etc\ndataset: d\nepsilons: [1]\n")
@example(data=b"name: x\ndataset: d\nepsilons: [.nan]\n")
@example(data=b"name: x\ndataset: d\nepsilons: [-1]\n")
@example(data=b"name: x\ndataset: d\nepsilons: [1]\ngenerator: {delta: .inf}\n")
@example(data=b"\xff\xfe\x00n\x00a")
@example(data=b"!!python/object/apply:os.system ['echo pwned']\n")
def test_pipeline_yaml(scratch, data):
    from privret.settings.pipeline import load_config

    path = scratch / "pipeline.yaml"
    path.write_bytes(data)
    cfg = _outcome("pipeline YAML", lambda: load_config(path))
    if cfg is not None:
        # what a loaded config promises: a run name that stays under runs/, valid epsilons
        assert (Path("runs") / cfg.name).resolve().parent == Path("runs").resolve()
        assert cfg.epsilons and all(e > 0 and not math.isnan(e) for e in cfg.epsilons)
        assert cfg.dataset.is_absolute()


# --- CLI numeric flags ----------------------------------------------------------------------------

class Reached(Exception):
    """The command got past every check and would start the long work."""


flag_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10 ** 20), 10 ** 20).map(str),
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e999", "-0", "0", "1e-320", "0x10", "", " ", "1,5", "abc", "1e3",
                     "99999999999999999999999", "--help"]))
GENERATOR_FLAGS = ["--epsilon", "--delta", "--batch-size", "--epochs", "--lr", "--clip-norm", "--seed", "--budget-cap"]
GENERATE_FLAGS = ["--num-queries", "--top-p", "--batch-size", "--seed"]
RETRIEVER_FLAGS = ["--epochs", "--batch-size", "--lr", "--temperature", "--seed"]


def _invoke(family: str, args: list[str]) -> None:
    from typer.testing import CliRunner

    from privret.cli import app

    def run():
        result = CliRunner().invoke(app, args)
        exc = result.exception
        if isinstance(exc, (Reached, InputError)):
            raise exc
        if isinstance(exc, SystemExit) or exc is None:
            assert result.exit_code in (0, 2), (args, result.exit_code, result.output)
            if result.exit_code == 2:
                raise InputError("usage error (exit 2)")
            return result
        raise AssertionError(f"{args}: {type(exc).__name__}: {exc}") from exc

    TRIED[family] += 1
    started = time.perf_counter()
    try:
        run()
    except (Reached, InputError):
        pass
    assert time.perf_counter() - started < SLOW_S
    HANDLED[family] += 1


@pytest.fixture()
def stubbed(monkeypatch):
    """Stop each command where its long work would begin, after the checks it makes first."""
    from privret.privacy import accounting
    from privret.synth import generate as gen_mod
    from privret.train import dp_run
    from privret.train import generator as gtrain
    from privret.train import retriever as rtrain

    def fast_calibrate(*, target_epsilon, delta, sample_rate, steps, accountant="prv"):
        if steps > accounting.MAX_STEPS or not 0 < sample_rate <= 1:
            raise InputError("too many steps", field="epochs")
        return 1.0

    def train_generator(pairs, out_dir, cfg, *, data_hash, dataset_id="", resume=False, budget=None, warm_start=None,
                        public_examples=None):
        sample_rate, steps, delta, sigma = gtrain._plan(cfg, len(pairs.units(cfg.unit)))
        assert 0 < sample_rate <= 1 and 0 < steps <= accounting.MAX_STEPS and math.isfinite(sigma)
        if math.isfinite(cfg.epsilon):
            assert accounting.MIN_EPSILON <= cfg.epsilon <= accounting.MAX_EPSILON and 0 < delta
        raise Reached

    def train_retriever(pairs, out_dir, cfg, *, ledger):
        assert cfg.epochs > 0 and cfg.batch_size > 1 and math.isfinite(cfg.learning_rate)
        raise Reached

    def generate_synthetic(generator_dir, documents, out_dir, cfg, *, blocklist=(), document_selection=None,
                           resume=False):
        assert cfg.num_queries > 0 and 0 < cfg.top_p <= 1 and cfg.batch_size > 0
        raise Reached

    monkeypatch.setattr(dp_run, "calibrate_noise", fast_calibrate)
    monkeypatch.setattr(gtrain, "train_generator", train_generator)
    monkeypatch.setattr(rtrain, "train_retriever", train_retriever)
    monkeypatch.setattr(gen_mod, "generate_synthetic", generate_synthetic)


@SETTINGS
@given(values=st.dictionaries(st.sampled_from(GENERATOR_FLAGS), flag_values, min_size=1, max_size=4))
def test_generator_train_flags(stubbed, toy_beir_module, scratch, values):
    args = ["generator", "train-dp", "--data", str(toy_beir_module), "--out", str(scratch / "gen-out")]
    for flag, value in values.items():
        args += [flag, value]
    _invoke("CLI flags: generator train-dp", args)


@SETTINGS
@given(values=st.dictionaries(st.sampled_from(GENERATE_FLAGS), flag_values, min_size=1, max_size=3))
def test_generate_flags(stubbed, toy_beir_module, scratch, values):
    args = ["synth", "generate", "--model", str(scratch / "gen"), "--data", str(toy_beir_module), "--out",
            str(scratch / "syn-out")]
    for flag, value in values.items():
        args += [flag, value]
    _invoke("CLI flags: synth generate", args)


@SETTINGS
@given(values=st.dictionaries(st.sampled_from(RETRIEVER_FLAGS), flag_values, min_size=1, max_size=3))
def test_retriever_train_flags(stubbed, toy_beir_module, scratch, values):
    args = ["retriever", "train", "--data", str(toy_beir_module), "--out", str(scratch / "ret-out")]
    for flag, value in values.items():
        args += [flag, value]
    _invoke("CLI flags: retriever train", args)


@pytest.fixture(scope="module")
def toy_beir_module(tmp_path_factory):
    from helpers import TOY_DOCS, TOY_TEST, TOY_TRAIN, write_beir_dir

    root = tmp_path_factory.mktemp("toy") / "toy"
    corpus = [{"_id": i, "title": t, "text": x} for i, t, x in TOY_DOCS]
    queries = [{"_id": q, "text": t} for q, t, _ in TOY_TRAIN + TOY_TEST]
    qrels = {"train": [(q, d, 1) for q, _, ds in TOY_TRAIN for d in ds],
             "test": [(q, d, 1) for q, _, ds in TOY_TEST for d in ds]}
    return write_beir_dir(root, corpus, queries, qrels)


@pytest.fixture(scope="module", autouse=True)
def _property_report():
    """After the module's tests, in whatever order they ran: the counts go to ``PRIVRET_PROPERTY_REPORT``.
    Every input tried and not handled has already failed its own test (:func:`_outcome`)."""
    yield
    report = os.environ.get("PRIVRET_PROPERTY_REPORT")
    if report:
        Path(report).write_text(json.dumps({"tried": dict(TRIED), "handled": dict(HANDLED),
                                            "total": sum(TRIED.values())}, indent=2) + "\n")


def test_outcome_accepts_only_a_result_or_a_one_line_input_error():
    """The harness every property above relies on: another exception fails, and is not counted as handled."""
    family = "harness probe"
    try:
        assert _outcome(family, lambda: 7) == 7
        assert _outcome(family, lambda: load_corpus(Path("/nonexistent/corpus.jsonl"))) is None  # InputError
        with pytest.raises(ValueError):
            _outcome(family, lambda: int("not a number"))
        assert (TRIED[family], HANDLED[family]) == (3, 2)
    finally:
        TRIED.pop(family, None)
        HANDLED.pop(family, None)
