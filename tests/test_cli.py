"""The command line: --help everywhere, one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import run_cli


@pytest.mark.parametrize("module", ["privret", "privret.cli"])
def test_the_installed_entry_point_in_a_subprocess(toy_beir, module):
    """The real process: `python -m privret` (and `python -m privret.cli`) exits 2 with one line on bad input, 0 on
    good."""
    (toy_beir / "queries.jsonl").write_text('{"_id": "q1"}\n')
    result = subprocess.run([sys.executable, "-m", module, "data", "validate", str(toy_beir)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "queries.jsonl:1, field 'text': missing" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Usage" in result.stdout


def _commands(group, prefix=()):
    import typer.main

    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, command in click_group.commands.items():
        yield (*prefix, name)
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))


def test_every_command_has_help():
    from privret.cli import app

    commands = list(_commands(app))
    assert ("generator", "train") in commands and ("pipeline",) in commands and ("demo",) in commands
    for command in commands:
        result = run_cli(*command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        assert "Usage" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["evaluate", "--no-such-flag"], "No such option '--no-such-flag'. (see privret evaluate --help)"),
    (["retriever", "train", "--out", "x", "--epochs", "many"],
     "Invalid value for '--epochs': 'many' is not a valid float. (see privret retriever train --help)"),
    (["retriever", "train"], "Missing option '--out'. (see privret retriever train --help)"),
    (["no-such-command"], "No such command 'no-such-command'. (see privret --help)"),
])
def test_a_usage_error_is_one_line_and_exit_2(args, message):
    """Click's usage errors (an unknown flag, a value of the wrong type, a missing option) end like any bad input:
    one line naming the problem and where the help is, exit 2 (not Click's boxed usage text)."""
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: {message}"


def test_a_group_without_its_command_shows_its_help():
    result = run_cli("data")
    assert "validate" in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert result.returncode == 2  # as Click's standalone mode ends it


def test_validate_ok(toy_beir):
    result = run_cli("data", "validate", str(toy_beir))
    assert result.returncode == 0 and "6 documents" in result.stdout


@pytest.mark.parametrize("corrupt, expected", [
    (lambda d: (d / "corpus.jsonl").write_bytes((d / "corpus.jsonl").read_bytes() + b'{"_id": "x", "text": "\xff"}\n'),
     "corpus.jsonl:7: not valid UTF-8"),
    (lambda d: (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nt1\tzzz\t1\n"),
     "test.tsv:2, field 'corpus-id': unknown document id 'zzz'"),
    (lambda d: (d / "queries.jsonl").write_text('{"_id": "q1"}\n'), "queries.jsonl:1, field 'text': missing"),
])
def test_bad_input_exits_2_with_one_line(toy_beir, corrupt, expected):
    corrupt(toy_beir)
    result = run_cli("data", "validate", str(toy_beir))
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_epsilon_and_delta_exit_2(toy_beir, tmp_path):
    out = tmp_path / "gen"
    result = run_cli("generator", "train-dp", "--data", str(toy_beir), "--out", str(out), "--epsilon", "-1")
    assert result.returncode == 2 and "epsilon must be > 0" in result.stderr
    result = run_cli("generator", "train-dp", "--data", str(toy_beir), "--out", str(out), "--delta", "0.5")
    assert result.returncode == 2 and "delta must be in (0, 1/n)" in result.stderr
    result = run_cli("generator", "train-dp", "--data", str(toy_beir), "--out", str(out), "--lr", "-1")
    assert result.returncode == 2 and "field '--lr'" in result.stderr  # the flag the user typed
    result = run_cli("generator", "train-dp", "--data", str(toy_beir), "--out", str(out), "--epsilon", "inf")
    assert result.returncode == 2 and "field '--epsilon'" in result.stderr and "generator train" in result.stderr
    result = run_cli("generator", "train-dp", "--data", str(toy_beir), "--out", str(out), "--unit", "household")
    assert result.returncode == 2 and "'--unit'" in result.stderr and "'query', 'pair', 'user'" in result.stderr
    assert not out.exists()


def _generator_config(monkeypatch, *args):
    """The GeneratorTrainConfig the command line ``args`` trains with (the training itself is stopped)."""
    from typer.testing import CliRunner

    from privret.cli import app
    from privret.train import generator as gtrain

    seen = {}

    def fake_train(pairs, out_dir, cfg, **kwargs):
        seen["cfg"] = cfg
        raise SystemExit(0)

    # the private worker, not train_generator: other modules import train_generator by name, and one
    # imported while it was patched would keep the fake for the rest of the pytest session
    monkeypatch.setattr(gtrain, "_train_generator", fake_train)
    result = CliRunner().invoke(app, list(args))
    assert "cfg" in seen, result.output
    return seen["cfg"]


def test_generator_train_dp_defaults_are_the_measured_regime(toy_beir, tmp_path, monkeypatch):
    """docs/results.md, "DP synthetic queries": LoRA rank 8 on the top 8 layers, DP-Adam lr 2e-3, expected batch
    64, 3 epochs, C = 1, documents cut at 128 tokens, PRV, epsilon 8; and the same fields from the settings model."""
    from privret.settings.training import GeneratorTrainConfig

    cfg = _generator_config(monkeypatch, "generator", "train-dp", "--data", str(toy_beir), "--out", str(tmp_path / "g"))
    assert cfg == GeneratorTrainConfig()
    assert (cfg.lora_rank, cfg.trained_layers, cfg.learning_rate, cfg.batch_size, cfg.epochs, cfg.clip_norm,
            cfg.max_doc_tokens, cfg.accountant, cfg.epsilon, cfg.trainable) == (8, 8, 2e-3, 64, 3.0, 1.0, 128, "prv",
                                                                                 8.0, "lora")


def test_generator_config_file_and_flags(toy_beir, tmp_path, monkeypatch):
    """--config sets the rarely changed fields, the flags given override it, and an unknown field, a bad value or a
    DP field given to the non-private command is one line naming the file and the field."""
    config = tmp_path / "generator.yaml"
    config.write_text("lora_rank: 16\ntrained_layers: 4\ncheckpoint_every: 3\nlearning_rate: 1.0e-3\n")
    cfg = _generator_config(monkeypatch, "generator", "train-dp", "--data", str(toy_beir), "--out",
                            str(tmp_path / "g"), "--config", str(config), "--lr", "5e-4", "--epsilon", "4")
    assert (cfg.lora_rank, cfg.trained_layers, cfg.checkpoint_every, cfg.learning_rate, cfg.epsilon) == (
        16, 4, 3, 5e-4, 4.0)
    cfg = _generator_config(monkeypatch, "generator", "train", "--non-private", "--data", str(toy_beir), "--out",
                            str(tmp_path / "g"),
                            "--config", str(config), "--epochs", "2")
    assert (cfg.lora_rank, cfg.epochs, cfg.learning_rate, cfg.epsilon) == (16, 2.0, 1e-3, float("inf"))
    for text, field in (("lora_rnak: 4\n", "lora_rnak"), ("lora_rank: -1\n", "lora_rank")):
        config.write_text(text)
        result = run_cli("generator", "train-dp", "--data", str(toy_beir), "--out", str(tmp_path / "g"), "--config",
                         str(config))
        assert result.returncode == 2 and str(config) in result.stderr and field in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    config.write_text("hold_out:\n  salt: fixed before the log\n")
    cfg = _generator_config(monkeypatch, "generator", "train-dp", "--data", str(toy_beir), "--out",
                            str(tmp_path / "g"), "--config", str(config), "--hold-out", "0.25")
    assert (cfg.hold_out.heldout_fraction, cfg.hold_out.salt) == (0.25, "fixed before the log")
    config.write_text("clip_norm: 0.5\n")
    result = run_cli("generator", "train", "--data", str(toy_beir), "--out", str(tmp_path / "g"), "--config",
                     str(config))
    assert result.returncode == 2 and str(config) in result.stderr and "clip_norm" in result.stderr
    assert "train-dp" in result.stderr and not (tmp_path / "g").exists()


def test_public_negatives_needs_a_public_corpus(tmp_path):
    """train-dp --method public-negatives on a pairs file with inline (private) documents and no --data: exit 2, one
    line saying what to pass, nothing written."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"what {w}", "doc": f"{w} document"}) + "\n"
                             for w in ("cell", "gene", "drug")))
    result = run_cli("retriever", "train-dp", "--pairs", str(pairs), "--out", str(tmp_path / "r"),
                     "--method", "public-negatives")
    assert result.returncode == 2 and "field '--data'" in result.stderr and "pass --data DIR" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
    # a pairs file is read whole: a split named beside it would be ignored, so it is refused
    result = run_cli("retriever", "train", "--pairs", str(pairs), "--out", str(tmp_path / "r"), "--split", "test")
    assert result.returncode == 2 and "field '--split'" in result.stderr and not (tmp_path / "r").exists()


def test_a_settings_error_of_several_flags_names_them_as_flags(toy_beir, tmp_path):
    """A check across fields (no location: --public-negatives 0 needs --hard-negatives) names both flags, in one
    line without pydantic's prefix, exit 2, nothing written."""
    result = run_cli("retriever", "train-dp", "--data", str(toy_beir), "--out", str(tmp_path / "r"),
                     "--public-negatives", "0", "--hard-negatives", "0")
    assert result.returncode == 2 and "--public-negatives or --hard-negatives >= 1" in result.stderr
    assert "Value error" not in result.stderr and "field '--'" not in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_pipeline_config_errors(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("name: x\ndataset: data\nepsilons: [8, -3]\n")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and "epsilons" in result.stderr
    config.write_text("name: x\ndataset: data\nepsilons: [8]\ngenerator: {clip_norm: .nan}\n")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and "generator.clip_norm" in result.stderr
    config.write_text("name: x\ndataset: data\nepsilons: [8]\ndirect_dp: {methods: [naive], epsilons: [8],\n"
                      "  settings: {batch_size: 8}, per_method: {naive: {trainable: everything}}}\n")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and "direct_dp.per_method.naive.trainable" in result.stderr
    config.write_text("name: x\ndataset: data\nepsilons: [8]\ndirect_dp: {methods: [naive], epsilons: [8],\n"
                      "  settings: {dropout: sometimes}}\n")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and "direct_dp.settings.dropout" in result.stderr
    # a row's method, epsilon and unit come from the grid and the config: a section that sets them is refused, not
    # silently overridden
    for section, field in (("settings: {unit: pair}", "settings"), ("per_method: {naive: {epsilon: 3}}", "per_method")):
        config.write_text(f"name: x\ndataset: data\nepsilons: [8]\ndirect_dp: {{methods: [naive], epsilons: [8],\n"
                          f"  {section}}}\n")
        result = run_cli("pipeline", str(config))
        assert result.returncode == 2 and f"'direct_dp.{field}'" in result.stderr and "each row's own" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # a setting the method refuses: one line naming the method, no traceback
    config.write_text("name: x\ndataset: data\nepsilons: [8]\ndirect_dp: {methods: [naive], epsilons: [8],\n"
                      "  settings: {spreadout_weight: 0.1}}\n")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and "method naive" in result.stderr and "spreadout_weight" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    config.write_text("name: [unclosed\n")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and "invalid YAML" in result.stderr
    # a key given twice: YAML keeps the last silently (the run would train at epsilon 3); refused at its line
    config.write_text("name: x\ndataset: data\nepsilons: [8]\ngenerator: {epochs: 1}\nepsilons: [3]\n")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and f"{config}:5: invalid YAML (key 'epsilons' given twice)" in result.stderr
    result = run_cli("pipeline", str(tmp_path))  # a directory
    assert result.returncode == 2 and f"{tmp_path}: config path is not a file" in result.stderr
    # PyYAML's reader error for a NUL byte spans two lines; ours must still be one
    config.write_bytes(b"\x00")
    result = run_cli("pipeline", str(config))
    assert result.returncode == 2 and "invalid YAML" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_pipeline_setting_refused_at_run_time_names_the_config_file(toy_beir, tmp_path):
    """A DP row's delta of 1/n or more is refused before any stage runs (the library names the field as the config
    does); the command adds the config file to the one line."""
    config = tmp_path / "pipe.yaml"
    config.write_text(f"name: x\ndataset: {toy_beir}\nepsilons: [8]\ngenerator: {{delta: 0.4}}\n")
    result = run_cli("pipeline", str(config), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert f"{config}, field 'generator.delta': delta must be in (0, 1/n)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()  # no run dir, no log
    (toy_beir / "queries.jsonl").write_text('{"_id": "q1"}\n')  # bad data: found before the run directory is made
    config.write_text(f"name: x\ndataset: {toy_beir}\nepsilons: [8]\n")
    result = run_cli("pipeline", str(config), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "queries.jsonl:1, field 'text': missing" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command, flag", [
    (["evaluate", "retrieval", "--model", "MISSING", "--data", "DATA", "--json", "OUT"], "--json"),
    (["evaluate", "retrieval", "--model", "MISSING", "--data", "DATA", "--per-query", "OUT"], "--per-query"),
    (["evaluate", "similarity", "--synthetic", "MISSING", "--data", "DATA", "--json", "OUT"], "--json"),
    (["audit", "overlap", "--data", "MISSING", "--json", "OUT"], "--json"),
    (["data", "squad-pairs", "--squad", "MISSING", "--out", "OUT"], "--out"),
    (["report", "MISSING", "--out", "OUT"], "--out"),
    (["report", "MISSING", "--utility-json", "OUT"], "--utility-json"),
])
@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_an_output_file_that_cannot_be_written_is_refused_before_any_work(toy_beir, tmp_path, command, flag, where):
    """An output file that is a directory, or lies under a file, is refused when the command line is read: the error
    names the flag and the path, not the missing input the command would have failed on first (the write itself
    would only fail after the whole evaluation)."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "a-file").write_text("x")
    target = tmp_path / "taken" if where == "a directory" else tmp_path / "a-file" / "out.json"
    places = {"MISSING": str(tmp_path / "missing"), "DATA": str(toy_beir), "OUT": str(target)}
    result = run_cli(*(places.get(a, a) for a in command))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    reason = "is a directory" if where == "a directory" else f"cannot be written: {tmp_path / 'a-file'} is a file"
    assert f"error: {target}, field '{flag}': {reason}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("code, shown", [(21, "TARGET: Is a directory"), (2, "TEMP: No such file or directory")])
def test_an_os_error_on_a_path_is_one_line_naming_the_output(monkeypatch, capsys, code, shown):
    """A path the OS refuses (found only when written) ends in one line and exit 2; a rename onto a directory names
    the output, not its temporary name. An OS error that is not the path's fault (a full disk) stays a crash."""
    import errno

    import privret.cli as cli

    def fails(errno_code):
        def app(**click_settings):
            raise OSError(errno_code, os.strerror(errno_code), "TEMP", None, "TARGET")
        return app

    monkeypatch.setattr(cli, "app", fails(code))
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {shown}"
    monkeypatch.setattr(cli, "app", fails(errno.ENOSPC))
    with pytest.raises(OSError, match="No space left"):
        cli.main()


def test_unknown_model_is_a_clear_error(toy_beir, tmp_path):
    result = run_cli("evaluate", "retrieval", "--model", str(tmp_path / "no-such-model"), "--data", str(toy_beir))
    assert result.returncode == 2 and "model directory not found" in result.stderr


@pytest.mark.parametrize("damage", ["truncated weights", "malformed config"])
def test_a_damaged_model_directory_is_one_line_naming_it(toy_beir, tiny_bert_dir, tmp_path, damage):
    import shutil

    model = shutil.copytree(tiny_bert_dir, tmp_path / "model")
    if damage == "truncated weights":
        weights = model / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:5])
    else:
        (model / "config.json").write_text('{"model_type": "bert", ')
    result = run_cli("evaluate", "retrieval", "--model", str(model), "--data", str(toy_beir))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{model}: cannot read the model (" in result.stderr and "damaged or incomplete" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_offline_hub_id_says_how_to_get_it(tmp_path, monkeypatch):
    from privret.errors import ModelUnavailableError
    from privret.models.registry import resolve

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelUnavailableError, match="hf download some-org/some-model"):
        resolve("some-org/some-model")


def test_json_metrics_output(tmp_path, toy_beir, tiny_bert_dir):
    out = tmp_path / "m.json"
    per_query = tmp_path / "q.json"
    result = run_cli("evaluate", "retrieval", "--model", str(tiny_bert_dir), "--data", str(toy_beir), "--json", str(out),
                     "--per-query", str(per_query))
    assert result.returncode == 0, result.stderr
    metrics = json.loads(out.read_text())
    assert set(metrics) >= {"ndcg@10", "recall@10", "recall@100", "mrr@10"} and metrics["queries"] == 2
    each = json.loads(per_query.read_text())
    assert len(each) == 2 and metrics["ndcg@10"] == pytest.approx(sum(v["ndcg@10"] for v in each.values()) / 2)


def test_library_errors_name_fields_and_the_cli_shows_flags(toy_beir, tmp_path):
    """The library names the field (min_tokens); the command line's one mapping shows the flag the user typed."""
    from privret.audit.overlap import corpus_overlap
    from privret.errors import InputError

    corpus = tmp_path / "public.txt"
    corpus.write_text("some public text\n")
    with pytest.raises(InputError) as raised:
        corpus_overlap(toy_beir, "train", [corpus], min_tokens=0)
    assert raised.value.field == "min_tokens"
    result = run_cli("audit", "overlap", "--data", str(toy_beir), "--corpus", str(corpus), "--min-tokens", "0",
                     "--no-likelihood")
    assert result.returncode == 2 and "field '--min-tokens': must be at least 1" in result.stderr
