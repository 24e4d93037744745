"""One pydantic validation error becomes one InputError line naming its field (privret.errors.invalid_input)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from privret.errors import InputError, invalid_input


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(1, gt=0)


class _Outer(BaseModel):
    inner: _Inner = _Inner()


def _error(**values) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        _Outer(**values)
    return err.value


def test_the_field_is_the_dotted_location_under_a_prefix_or_named_by_the_caller():
    err = _error(inner={"batch_size": 0})
    plain = invalid_input(err, path="grid.yaml")
    assert isinstance(plain, InputError) and plain.field == "inner.batch_size" and plain.path == "grid.yaml"
    assert plain.message == err.errors()[0]["msg"] and len(str(plain).splitlines()) == 1
    assert invalid_input(err, under="direct_dp.settings").field == "direct_dp.settings.inner.batch_size"
    assert invalid_input(err, name=lambda loc: "/".join(map(str, loc))).field == "inner/batch_size"
    assert invalid_input(err, what="invalid generator setting").message.startswith("invalid generator setting: ")
    assert invalid_input(_error(inner={"unknown": 1})).field == "inner.unknown"
