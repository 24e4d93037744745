"""The Python API (privret.api): the README's example, DP training from a list and a datasets.Dataset with the ledger
the command line writes for the same data, nothing written without out_dir, the budget registry only when asked,
bad input named by its field, and the synthetic route to a retriever that carries the generator's ledger."""

import json
import re
import tempfile
from pathlib import Path

import pytest

import privret
from helpers import TOY_DOCS, TOY_TEST, TOY_TRAIN, run_cli, write_tiny_bert
from privret.errors import InputError
from privret.privacy.ledger import PrivacyLedger
from privret.train.public_start import examples_hash

README = Path(__file__).resolve().parents[1] / "README.md"
# the settings of the small runs below (a few steps on the toy log of five queries)
SMALL = dict(method="public-negatives", batch_size=3, epochs=1.0, trainable="bias", public_negatives=2,
             hard_negatives=0)
SMALL_FLAGS = ["--method", "public-negatives", "--batch-size", "3", "--epochs", "1", "--trainable", "bias",
               "--public-negatives", "2", "--hard-negatives", "0"]


@pytest.fixture(scope="module")
def three_layer_bert(tmp_path_factory) -> Path:
    """The tiny encoder with the 3 layers that the default regime trains the biases of (bias-top:3)."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-3"), layers=3)


def _toy_records() -> list[dict]:
    return [{"query": text, "doc_id": doc} for _, text, docs in TOY_TRAIN for doc in docs]


def _toy_corpus() -> dict[str, dict]:
    return {doc_id: {"title": title, "text": text} for doc_id, title, text in TOY_DOCS}


def _ledger_fields(ledger: PrivacyLedger, *, without=("created_at",)) -> dict:
    return {k: v for k, v in ledger.model_dump(mode="json").items() if k not in without}


def test_readme_example_runs_as_written(three_layer_bert, monkeypatch, tmp_path):
    """The README's Python block, run with a tiny encoder in place of the default one (and so the default regime)."""
    block = re.search(r"## Python\n.*?```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md has no ```python block under a '## Python' heading"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 10 and '"minilm-l6"' in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code.replace('"minilm-l6"', repr(str(three_layer_bert))), "README.md", "exec"), scope)
    ledger = scope["ledger"]
    assert ledger.epsilon == pytest.approx(8.0, rel=0.01) and ledger.mechanism == "direct-public-negatives"
    assert (ledger.sample_rate, ledger.steps, ledger.trainable) == (1.0, 48, "bias-top:3")  # the measured regime
    assert set(scope["metrics"]) >= {"ndcg@10", "recall@10", "mrr@10"}
    assert list(tmp_path.iterdir()) == []  # the example writes nothing


@pytest.mark.parametrize("form", ["list", "dataset"])
def test_dp_training_from_memory_gives_the_ledger_and_config_of_the_cli(form, tiny_bert_dir, toy_beir, tmp_path):
    """The same data as a list of records, or a datasets.Dataset, and as the BEIR split the command line reads:
    the same ledger (all but the data files' hash and the stamp) and the same training settings."""
    records = _toy_records()
    pairs = records if form == "list" else __import__("datasets").Dataset.from_list(records)
    model, ledger = privret.train_dp_retriever(str(tiny_bert_dir), pairs, _toy_corpus(), epsilon=8.0,
                                               out_dir=tmp_path / "api", **SMALL)
    assert ledger.epsilon == pytest.approx(8.0, rel=0.01) and ledger.mechanism == "direct-public-negatives"
    assert ledger.n_units == len(TOY_TRAIN) and model.encode(["aspirin"]).shape == (1, 32)
    assert PrivacyLedger.load(tmp_path / "api") == ledger
    done = run_cli("retriever", "train-dp", "--data", str(toy_beir), "--split", "train", "--out", str(tmp_path / "cli"),
                   "--model", str(tiny_bert_dir), "--epsilon", "8", *SMALL_FLAGS)
    assert done.returncode == 0, done.stderr
    cli = PrivacyLedger.load(tmp_path / "cli")
    assert _ledger_fields(ledger, without=("created_at", "data_hash")) == _ledger_fields(
        cli, without=("created_at", "data_hash"))
    config = [json.loads((tmp_path / d / "train_config.json").read_text()) for d in ("api", "cli")]
    assert config[0] == config[1]


def test_dp_training_on_a_beir_directory_matches_the_cli_ledger_exactly(tiny_bert_dir, toy_beir, tmp_path):
    """A path is read as the command line reads it: the ledger differs from the CLI's only by its stamp."""
    _, ledger = privret.train_dp_retriever(str(tiny_bert_dir), toy_beir, epsilon=4.0, out_dir=tmp_path / "api",
                                           **SMALL)
    done = run_cli("retriever", "train-dp", "--data", str(toy_beir), "--out", str(tmp_path / "cli"),
                   "--model", str(tiny_bert_dir), "--epsilon", "4", *SMALL_FLAGS)
    assert done.returncode == 0, done.stderr
    assert _ledger_fields(ledger) == _ledger_fields(PrivacyLedger.load(tmp_path / "cli"))


def test_nothing_is_written_without_out_dir_and_the_registry_only_when_asked(tiny_bert_dir, tmp_path, monkeypatch):
    """Without out_dir, budget or dataset_name: no file in HOME, the working directory, the cache, the temporary
    directory or the budget registry. With dataset_name: the release is in the registry, and nothing else."""
    places = {name: tmp_path / name for name in ("home", "cwd", "cache", "tmp")}
    for place in places.values():
        place.mkdir()
    monkeypatch.setenv("HOME", str(places["home"]))
    monkeypatch.setenv("PRIVRET_CACHE", str(places["cache"]))
    monkeypatch.setattr(tempfile, "tempdir", str(places["tmp"]))
    monkeypatch.chdir(places["cwd"])
    budget_dir = tmp_path / "budget"  # the conftest's PRIVRET_BUDGET_DIR
    model, ledger = privret.train_dp_retriever(tiny_bert_dir, _toy_records(), _toy_corpus(), epsilon=8.0, **SMALL)
    assert model.encode(["aspirin"]).shape == (1, 32) and ledger.epsilon == pytest.approx(8.0, rel=0.01)
    assert not budget_dir.exists()
    assert {name: sorted(p.name for p in place.rglob("*")) for name, place in places.items()} == {
        name: [] for name in places}
    privret.train_dp_retriever(tiny_bert_dir, _toy_records(), _toy_corpus(), epsilon=8.0, dataset_name="toy",
                               **SMALL)
    assert [p.name for p in budget_dir.glob("*.jsonl")] == ["name-toy.jsonl"]
    assert {name: list(place.rglob("*")) for name, place in places.items()} == {name: [] for name in places}


@pytest.mark.parametrize("call, field", [
    (lambda m: privret.train_dp_retriever(m, _toy_records(), _toy_corpus(), epsilon=8.0, bogus=1), "bogus"),
    (lambda m: privret.train_dp_retriever(m, _toy_records(), _toy_corpus(), epsilon=8.0, batch_size=0),
     "batch_size"),
    (lambda m: privret.train_dp_retriever(m, _toy_records(), _toy_corpus(), epsilon=-1.0), "epsilon"),
    (lambda m: privret.train_dp_retriever(m, [("aspirin", "nowhere")], _toy_corpus(), epsilon=8.0), "doc_id"),
    (lambda m: privret.train_dp_retriever(m, [{"doc_id": "d1"}], _toy_corpus(), epsilon=8.0), "query"),
    (lambda m: privret.train_dp_retriever(m, [{"query": "q", "doc": "inline"}], epsilon=8.0, **SMALL), "corpus"),
    (lambda m: privret.train_dp_retriever(m, _toy_records(), _toy_corpus(), epsilon=8.0, resume=True), "resume"),
    (lambda m: privret.train_dp_retriever(m, _toy_records(), _toy_corpus(), epsilon=8.0, method="batch-clip",
                                          public_negatives=4), "public_negatives"),
    (lambda m: privret.train_retriever(m, _toy_records(), _toy_corpus(), learning_rate=0), "learning_rate"),
    (lambda m: privret.evaluate_retrieval(m, {"q": "aspirin"}, _toy_corpus(), {"q": {"d9": 1}}), "doc_id"),
])
def test_bad_input_names_the_field(call, field, tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as caught:
        call(str(tiny_bert_dir))
    assert caught.value.field == field, caught.value
    assert list(tmp_path.iterdir()) == []


def test_a_model_the_api_trained_with_dp_is_no_public_starting_point(tiny_bert_dir):
    """The returned model carries its ledger: starting another DP run from it is refused, as from its directory."""
    model, _ = privret.train_dp_retriever(str(tiny_bert_dir), _toy_records(), _toy_corpus(), epsilon=8.0, **SMALL)
    with pytest.raises(InputError, match="needs a public model") as caught:
        privret.train_dp_retriever(model, _toy_records(), _toy_corpus(), epsilon=8.0, **SMALL)
    assert caught.value.field == "model"


def test_synthetic_route_carries_the_generator_ledger(tiny_llama_dir, tiny_bert_dir, tmp_path):
    """DP generator -> queries in memory -> a non-private retriever on them: its ledger is the generator's, and the
    evaluation runs on a BEIR directory and on data in memory alike."""
    queries = {"t1": TOY_TEST[0][1], "t2": TOY_TEST[1][1]}
    shown = [(TOY_DOCS[0][2], "aspirin heart risk")]
    with privret.train_dp_generator(str(tiny_llama_dir), _toy_records(), _toy_corpus(), epsilon=8.0, batch_size=3,
                                    epochs=1, trained_layers=1, physical_batch=4, bf16=False,
                                    public_examples=shown) as generator:
        assert generator.ledger.epsilon == pytest.approx(8.0, rel=0.01) and generator.path.is_dir()
        assert generator.ledger.provenance["warm_start"]["public_data_hash"] == examples_hash(shown)
        synthetic = privret.generate_queries(generator, _toy_corpus(), num_queries=2, max_new_tokens=6)
    assert not generator.path.exists()  # closed: the temporary generator is gone
    assert synthetic.ledger.epsilon == generator.ledger.epsilon and synthetic.manifest["generated"] == 12
    assert {p["doc_id"] for p in synthetic.pairs} <= set(_toy_corpus())
    with pytest.raises(InputError) as caught:  # its ledger already says what the pairs are
        privret.train_retriever(str(tiny_bert_dir), synthetic, public=True)
    assert caught.value.field == "public"
    model, ledger = privret.train_retriever(str(tiny_bert_dir), synthetic, batch_size=2)
    assert ledger.epsilon == generator.ledger.epsilon and ledger.mechanism == "dp-sgd"
    qrels = {"t1": {"d1": 1}, "t2": {"d6": 1}}
    metrics = privret.evaluate_retrieval(model, queries, _toy_corpus(), qrels)
    assert metrics["queries"] == 2 and 0 <= metrics["ndcg@10"] <= 1


def test_no_api_name_is_shadowed_by_a_subpackage():
    """An API name that is also a module of privret (privret.evaluate is a package) would be replaced by that module
    once anything imports it: privret.<name>(...) would then fail depending on import order."""
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(privret.__path__)}
    assert modules and not set(privret.__all__) & modules
    for name in privret.__all__:
        assert callable(getattr(privret, name))
