"""``--config FILE``: a YAML file's fields under the flags given, one-line errors naming the file and the field."""

from __future__ import annotations

import pytest

from privret.cli.common import build_config
from privret.errors import InputError
from privret.settings.training import DPRetrieverConfig


def test_the_file_sets_what_the_flags_do_not(tmp_path):
    config = tmp_path / "dp.yaml"
    config.write_text("lora_rank: 4\ntrainable: lora\nlearning_rate: 0.01\nhold_out: {salt: pub}\n")
    cfg = build_config(DPRetrieverConfig, config_file=config, learning_rate=0.5, hold_out={"heldout_fraction": 0.2})
    assert (cfg.lora_rank, cfg.trainable) == (4, "lora")  # from the file
    assert cfg.learning_rate == 0.5  # the flag over the file
    assert (cfg.hold_out.salt, cfg.hold_out.heldout_fraction) == ("pub", 0.2)  # a mapping merged, key by key
    assert build_config(DPRetrieverConfig, config_file=None, lora_rank=2).lora_rank == 2


@pytest.mark.parametrize("text, field, message", [
    ("lora_rnak: 4\n", "lora_rnak", "unknown field (not a setting of DPRetrieverConfig)"),
    ("lora_rank: -1\n", "lora_rank", "greater than 0"),
    ("hold_out: {heldout_fraction: 2}\n", "hold_out.heldout_fraction", "less than 1"),
    ("spreadout_weight: 1\nmethod: naive\n", "spreadout_weight", "applies to logit-dp only"),
])
def test_a_bad_field_of_the_file_names_the_file_and_the_field(tmp_path, text, field, message):
    config = tmp_path / "dp.yaml"
    config.write_text(text)
    with pytest.raises(InputError) as caught:
        build_config(DPRetrieverConfig, config_file=config)
    assert caught.value.path == str(config) and caught.value.field == field and message in caught.value.message
    assert f"{config}, field '{field}': " in caught.value.one_line()


def test_a_bad_flag_over_a_good_file_names_the_flag(tmp_path):
    config = tmp_path / "dp.yaml"
    config.write_text("learning_rate: 0.01\n")
    with pytest.raises(InputError) as caught:
        build_config(DPRetrieverConfig, config_file=config, learning_rate=-1.0)
    assert caught.value.path is None and caught.value.field == "--lr"


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path):
    config = tmp_path / "dp.yaml"
    config.write_text("- 1\n")
    with pytest.raises(InputError, match="config must be a YAML mapping"):
        build_config(DPRetrieverConfig, config_file=config)
