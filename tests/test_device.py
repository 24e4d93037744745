"""Choosing the device (--device, config field device) and bf16 autocast only where the device runs bf16
natively (emulated bf16 is far slower on CPUs); tests marked gpu run on CUDA only."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import WORDS
from privret.models import device
from privret.privacy.budget import BudgetPolicy


def test_bf16_autocast_follows_native_support(monkeypatch):
    for native in (True, False):
        monkeypatch.setattr(device, "native_bf16", lambda _device, native=native: native)
        with device.bf16_autocast("cpu", True):
            assert torch.is_autocast_enabled("cpu") is native
            if native:
                assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        with device.bf16_autocast("cpu", False):
            assert not torch.is_autocast_enabled("cpu")


def test_generator_uses_bf16_only_where_native(monkeypatch, tiny_llama_dir):
    from privret.models import generator

    for native in (True, False):
        monkeypatch.setattr(device, "native_bf16", lambda _device, native=native: native)
        gen = generator.load_generator(str(tiny_llama_dir), bf16=True)
        assert gen.bf16 is native
        assert generator.load_generator(str(tiny_llama_dir), bf16=False).bf16 is False


def test_search_without_bf16_is_float32_where_bf16_is_native(monkeypatch, tiny_bert_dir):
    """``bf16=False`` (``privret evaluate --no-bf16``) encodes in float32 even where bf16 autocast would run: the
    same scores as on a device without native bf16, while the default's scores move (bf16 keeps ~3 digits)."""
    from privret.data.beir import Document
    from privret.models.encoder import load_encoder
    from privret.retrieval.search import search

    corpus = {f"d{i}": Document(f"d{i}", "", " ".join(WORDS[i: i + 8])) for i in range(0, 40, 4)}
    queries = {f"q{i}": " ".join(WORDS[i + 1: i + 4]) for i in range(0, 40, 8)}
    model = load_encoder(str(tiny_bert_dir), max_seq_length=32, device="cpu")
    monkeypatch.setattr(device, "native_bf16", lambda _device: False)  # a CPU without native bf16: float32
    float32 = search(model, corpus, queries, k=3)
    monkeypatch.setattr(device, "native_bf16", lambda _device: True)
    assert search(model, corpus, queries, k=3, bf16=False) == float32
    assert search(model, corpus, queries, k=3) != float32


def test_evaluate_no_bf16_reaches_the_search(monkeypatch, tiny_bert_dir, toy_beir):
    from typer.testing import CliRunner

    from privret.cli import app
    from privret.retrieval import metrics

    seen, real = [], metrics.evaluate_per_query
    monkeypatch.setattr(metrics, "evaluate_per_query", lambda *a, **kw: seen.append(kw["bf16"]) or real(*a, **kw))
    for flag in ([], ["--no-bf16"]):
        result = CliRunner().invoke(app, ["evaluate", "retrieval", "--model", str(tiny_bert_dir), "--data", str(toy_beir), *flag])
        assert result.exit_code == 0, result.output
    assert seen == [True, False]


def test_evaluate_records_the_number_format_it_encoded_in(monkeypatch, tiny_bert_dir, toy_beir, tmp_path):
    """``--json`` says whether the encodings ran under bf16 autocast: the same command differs between machines."""
    import json

    from typer.testing import CliRunner

    from privret.cli import app

    seen = []
    for native, flag in [(True, []), (True, ["--no-bf16"]), (False, [])]:
        monkeypatch.setattr(device, "native_bf16", lambda _device, native=native: native)
        out = tmp_path / f"{native}{flag}.json"
        result = CliRunner().invoke(app, ["evaluate", "retrieval", "--model", str(tiny_bert_dir), "--data", str(toy_beir),
                                          "--json", str(out), *flag])
        assert result.exit_code == 0, result.output
        seen.append(json.loads(out.read_text())["precision"])
    assert seen == ["bf16-autocast", "float32", "float32"]


def test_trained_models_record_the_number_format_their_bf16_setting_resolved_to(monkeypatch, tiny_bert_dir,
                                                                                tiny_llama_dir, tmp_path):
    """``bf16: true`` trains under bf16 autocast on one machine and in float32 on another: train_config.json says
    which (retriever and generator)."""
    import json

    from privret.data.beir import Document
    from privret.data.pairs import QueryDocPair, TrainingPairs
    from privret.train.generator import train_generator
    from privret.train.retriever import non_private_ledger, train_retriever
    from privret.settings.training import GeneratorTrainConfig, RetrieverTrainConfig

    pairs = TrainingPairs([QueryDocPair(f"gene {w}", f"d{i}") for i, w in enumerate(WORDS[:4])],
                          {f"d{i}": Document(f"d{i}", "", f"{w} study") for i, w in enumerate(WORDS[:4])})
    ledger = non_private_ledger(pairs, str(tiny_bert_dir), "h" * 64, "query")
    seen = []
    for native, bf16 in [(True, True), (True, False), (False, True)]:
        monkeypatch.setattr(device, "native_bf16", lambda _device, native=native: native)
        out = train_retriever(pairs, tmp_path / f"r-{native}-{bf16}", ledger=ledger,
                              cfg=RetrieverTrainConfig(model=str(tiny_bert_dir), batch_size=2, bf16=bf16))
        seen.append(json.loads((out / "train_config.json").read_text())["precision"])
    assert seen == ["bf16-autocast", "float32", "float32"]
    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=math.inf, batch_size=4, epochs=1, trained_layers=1,
                               lora_rank=2, bf16=False)
    monkeypatch.setattr(device, "native_bf16", lambda _device: True)
    train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc")
    released = json.loads((tmp_path / "gen" / "train_config.json").read_text())
    assert released["precision"] == "float32"
    # it depends on the machine and the settings only: another private log gives the same released file
    other = TrainingPairs([QueryDocPair(f"why {w}", f"d{i}") for i, w in enumerate(WORDS[10:16])],
                          {f"d{i}": Document(f"d{i}", "", f"{w} trial") for i, w in enumerate(WORDS[10:16])})
    train_generator(other, tmp_path / "gen-other", cfg, data_hash="def")
    assert json.loads((tmp_path / "gen-other" / "train_config.json").read_text()) == released


def test_native_bf16_on_cpu_is_onednn_support():
    assert device.native_bf16("cpu") is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# -- choosing the device (--device, config field device) ---------------------------------------------------------
NO_CUDA = not torch.cuda.is_available()
UNRECORDED = BudgetPolicy(enabled=False)  # the same data trained twice here: the registry would refuse the second


@pytest.mark.parametrize("available", [True, False])
def test_auto_is_cuda_exactly_when_available(monkeypatch, available):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert device.resolve_device("auto").type == ("cuda" if available else "cpu")
    assert device.resolve_device("cpu").type == "cpu"


def test_under_torchrun_auto_and_cuda_mean_the_ranks_own_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert device.resolve_device("auto") == torch.device("cuda")  # one process: the current GPU
    for name, value in {"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2"}.items():
        monkeypatch.setenv(name, value)
    assert device.resolve_device("auto") == torch.device("cuda", 2)
    assert device.resolve_device("cuda") == torch.device("cuda", 2)
    assert device.resolve_device("cuda:1") == torch.device("cuda", 1)  # as written
    assert device.resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["gpu", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:0:1", "", " cpu", "mps"])
def test_malformed_device_strings_are_refused(spec):
    with pytest.raises(ValueError, match="is not a device"):
        device.resolve_device(spec)


def test_cuda_without_cuda_and_a_missing_gpu_are_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match="CUDA is not available on this machine"):
            device.resolve_device(spec)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device.resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match="has 1 CUDA device"):
        device.resolve_device("cuda:1")


def test_use_device_sets_where_models_go_and_restores_it(monkeypatch, tiny_bert_dir, tiny_llama_dir):
    from privret.models.encoder import load_encoder
    from privret.models.generator import load_generator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # so that 'auto' would mean cuda
    with device.use_device("cpu"):
        assert device.resolve_device() == torch.device("cpu")
        assert load_encoder(str(tiny_bert_dir), max_seq_length=32).device.type == "cpu"
        assert load_generator(str(tiny_llama_dir)).device.type == "cpu"
    assert device.resolve_device().type == "cuda"  # back to auto
    with pytest.raises(ValueError, match="is not a device"):
        with device.use_device("gpu"):
            pass
    assert device.resolve_device().type == "cuda"


def test_cli_device_errors_are_one_line_naming_the_flag(toy_beir, tmp_path):
    from test_cli import run_cli

    for args in (["evaluate", "retrieval", "--model", "minilm-l6", "--data", str(toy_beir), "--device", "gpu"],
                 ["retriever", "train", "--data", str(toy_beir), "--out", str(tmp_path / "r"), "--device", "cuda:x"]):
        proc = run_cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "field '--device'" in proc.stderr
        assert "is not a device" in proc.stderr
    if NO_CUDA:
        proc = run_cli("evaluate", "retrieval", "--model", "minilm-l6", "--data", str(toy_beir), "--device", "cuda")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
        assert "field '--device'" in proc.stderr and "CUDA is not available" in proc.stderr


def test_pipeline_config_device_field_is_checked(tmp_path):
    from privret.settings.pipeline import load_config
    from privret.errors import InputError

    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndataset: d\nepsilons: [8]\ndevice: gpu\n")
    with pytest.raises(InputError, match="field 'device': .*is not a device") as err:
        load_config(path)
    assert str(path) in err.value.one_line()
    path.write_text("name: x\ndataset: d\nepsilons: [8]\n")
    assert load_config(path).device == "auto"


def _dp_ledger(tmp_path, tiny_bert_dir, spec: str, name: str):
    from privret.data.beir import Document
    from privret.data.pairs import QueryDocPair, TrainingPairs
    from privret.train.dp_retriever import train_dp_retriever
    from privret.settings.training import DPRetrieverConfig

    corpus = {f"d{i}": Document(f"d{i}", "", f"document {w}") for i, w in enumerate(WORDS[:8])}
    pairs = TrainingPairs(pairs=[QueryDocPair(query=f"what {w}", doc_id=f"d{i}", query_id=f"q{i}")
                                 for i, w in enumerate(WORDS[:8])], corpus=corpus)
    cfg = DPRetrieverConfig(method="naive", model=str(tiny_bert_dir), epsilon=8.0, epochs=1.0, batch_size=4,
                            clip_norm=0.1, max_query_tokens=16, max_doc_tokens=16, trainable="top:1")
    with device.use_device(spec):
        ledger = train_dp_retriever(pairs, tmp_path / name, cfg, data_hash="h", budget=UNRECORDED)
    return ledger.model_dump(exclude={"created_at"})  # created_at: the wall-clock time of the release


def test_dp_ledger_does_not_depend_on_the_device_string(tmp_path, tiny_bert_dir):
    """'cpu' and 'auto' (what 'auto' resolves to here) release under the same ledger, field for field."""
    cpu = _dp_ledger(tmp_path, tiny_bert_dir, "cpu", "cpu")
    auto = _dp_ledger(tmp_path, tiny_bert_dir, "auto", "auto")
    assert cpu == auto and cpu["steps"] > 0 and math.isfinite(cpu["epsilon"])


# -- on a CUDA GPU (pytest -m gpu; skipped without CUDA) ---------------------------------------------------------


@pytest.mark.gpu
def test_noise_is_drawn_for_and_placed_on_the_gradients_device():
    from privret.privacy.secure_rng import SecureRandom, noise_like

    grad = torch.zeros(1000, device="cuda")
    for rng in (torch.Generator().manual_seed(0), SecureRandom()):
        noise = noise_like(grad, 2.0, rng)
        assert noise.device == grad.device and noise.dtype == torch.float32
        assert 1.5 < float(noise.std()) < 2.5


@pytest.mark.gpu
def test_encoder_on_cuda_agrees_with_the_cpu(tiny_bert_dir):
    from privret.retrieval.embedding import encode
    from privret.models.encoder import load_encoder

    texts = [" ".join(WORDS[i: i + 6]) for i in range(0, 60, 6)]
    on_gpu = load_encoder(str(tiny_bert_dir), max_seq_length=32, device="cuda")
    assert on_gpu.device.type == "cuda"
    gpu = encode(on_gpu, texts, bf16=False)
    cpu = encode(load_encoder(str(tiny_bert_dir), max_seq_length=32, device="cpu"), texts, bf16=False)
    assert torch.isfinite(torch.from_numpy(gpu)).all()
    assert abs(gpu - cpu).max() < 1e-4
    assert abs(encode(on_gpu, texts, bf16=True) - cpu).max() < 5e-2  # bf16 autocast where native


@pytest.mark.gpu
def test_tiny_dp_run_on_cuda_has_the_cpu_ledger_and_finite_weights(tmp_path, tiny_bert_dir):
    from privret.models.encoder import load_encoder

    assert _dp_ledger(tmp_path, tiny_bert_dir, "cuda", "gpu") == _dp_ledger(tmp_path, tiny_bert_dir, "cpu", "cpu")
    trained = load_encoder(str(tmp_path / "gpu"), device="cuda")
    assert all(torch.isfinite(p).all() for p in trained.parameters())


@pytest.mark.gpu
def test_dp_generator_on_cuda_has_the_cpu_ledger_and_samples(tmp_path, tiny_llama_dir):
    from helpers import toy_pairs
    from privret.models.generator import load_trained_generator
    from privret.train.generator import train_generator
    from privret.settings.training import GeneratorTrainConfig

    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=8.0, batch_size=4, epochs=1, trained_layers=1,
                               lora_rank=4)
    ledgers = {}
    for spec in ("cuda", "cpu"):
        with device.use_device(spec):
            ledgers[spec] = train_generator(toy_pairs(), tmp_path / spec, cfg, data_hash="abc",
                                            budget=UNRECORDED).model_dump(exclude={"created_at"})
    assert ledgers["cuda"] == ledgers["cpu"]
    gen = load_trained_generator(tmp_path / "cuda", device="cuda")
    assert gen.device.type == "cuda" and gen.bf16 is torch.cuda.is_bf16_supported(including_emulation=False)
    assert all(torch.isfinite(p).all() for p in gen.model.parameters())
    assert len(gen.generate(["the cell gene protein"], max_new_tokens=4, seed=0)[0]) == 1
