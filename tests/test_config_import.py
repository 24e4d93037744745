"""Reading a pipeline config is torch-free: the config classes live in modules that import neither torch,
transformers nor the trainers, so validating a YAML file is fast and works without the model stack."""

import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "transformers", "privret.train.dp_retriever", "privret.train.generator", "privret.train.retriever",
         "privret.synth.generate", "privret.synth.filter")


def test_loading_a_config_imports_no_torch_nor_trainer(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(textwrap.dedent("""\
        name: light
        dataset: data
        epsilons: [4.0]
        device: cpu
        synthetic_filter: {top_k: 5}
        direct_dp: {methods: [logit-dp], epsilons: [2.0], settings: {batch_size: 8}}
        """))
    probe = textwrap.dedent(f"""\
        import sys
        from privret.settings.pipeline import load_config
        config = load_config({str(config)!r})
        assert config.direct_dp.config("logit-dp", 2.0, config.unit).batch_size == 8
        print(",".join(m for m in {HEAVY!r} if m in sys.modules))
        """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"loading a config imported {done.stdout.strip()}"


@pytest.mark.parametrize("extra, field", [
    ('dataset: "data\\0set"\n', "dataset"),
    ('dataset: d\npublic_rows: {public_pairs: "p\\0.jsonl"}\n', "public_rows.public_pairs"),
    ('dataset: d\nsynthetic_documents: {source: list, ids_file: "i\\0ds"}\n', "synthetic_documents.ids_file"),
])
def test_a_path_with_a_nul_byte_is_refused_with_its_field(tmp_path, extra, field):
    """Found by the property test of pipeline YAML: pathlib's resolve raised a bare ValueError on it. Every path
    field of a config is a ConfigPath, so each one is refused with its own name."""
    from privret.settings.pipeline import load_config
    from privret.errors import InputError

    path = tmp_path / "p.yaml"
    path.write_text("name: nul\nepsilons: [8]\n" + extra)
    with pytest.raises(InputError) as err:
        load_config(path)
    assert err.value.field == field and "NUL" in str(err.value)


def test_changed_from_default_names_only_the_fields_given_another_value():
    """The check behind every "this setting would be ignored" refusal: a value equal to the default (typed or not)
    passes, any other value is named; fields with a default factory and nested models compare by value."""
    from pydantic import BaseModel, Field

    from privret.settings.fields import changed_from_default

    class Inner(BaseModel):
        k: int = 1

    class Settings(BaseModel):
        rate: float = 0.5
        names: list[str] = Field(default_factory=lambda: ["a"])
        inner: Inner = Inner()

    fields = ("rate", "names", "inner")
    assert changed_from_default(Settings(), fields) == []
    assert changed_from_default(Settings(rate=0.5, names=["a"], inner={"k": 1}), fields) == []
    assert changed_from_default(Settings(rate=0.25, inner={"k": 2}), fields) == ["rate", "inner"]
    assert changed_from_default(Settings(names=["a", "b"]), fields) == ["names"]
    assert changed_from_default(Settings(rate=0.25), ["names"]) == []
