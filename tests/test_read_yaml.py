"""privret.io.read_yaml_mapping: the one reader of pipeline and federated config files."""

from __future__ import annotations

import pytest

from privret.errors import InputError
from privret.io import read_yaml_mapping


def _read(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return read_yaml_mapping(path)


def test_a_key_given_twice_is_refused_at_its_line_at_any_depth(tmp_path):
    with pytest.raises(InputError, match=r"invalid YAML \(key 'c' given twice\)") as err:
        _read(tmp_path, "a: 1\nb: {c: 1,\n  c: 2}\n")
    assert err.value.line == 3


def test_merge_keys_still_merge_and_may_be_overridden(tmp_path):
    """``<<: *anchor`` shares settings between sections (per_method, say); a key set beside it wins."""
    assert _read(tmp_path, "base: &b {x: 1, y: 2}\nrow: {<<: *b, y: 3}\n") == {"base": {"x": 1, "y": 2},
                                                                          "row": {"x": 1, "y": 3}}


@pytest.mark.parametrize("text, message", [("? [a, b]\n: 1\n", "found unhashable key"),
                                           ("- 1\n- 2\n", "config must be a YAML mapping"),
                                           ("a: [unclosed\n", "invalid YAML")])
def test_what_is_not_a_mapping_of_config_fields_is_one_input_error(tmp_path, text, message):
    with pytest.raises(InputError, match=message) as err:
        _read(tmp_path, text)
    assert err.value.path == str(tmp_path / "c.yaml")


def test_an_empty_file_means_no_field_set(tmp_path):
    """A federated --config of comments only sets nothing (its defaults); a pipeline config then lacks `name`."""
    assert _read(tmp_path, "# nothing yet\n") == {}
