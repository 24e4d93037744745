"""The device strings privret accepts (``auto``, ``cpu``, ``cuda``, ``cuda:N``), checked without torch,
so that configs can hold one; :func:`privret.models.device.resolve_device` turns one into a ``torch.device``."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
_SPEC = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device_spec(spec: str) -> str:
    """``spec`` if it is a device string privret accepts (``auto``, ``cpu``, ``cuda``, ``cuda:N``), else ValueError."""
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise ValueError(f"'{spec}' is not a device ({DEVICE_CHOICES})")
    return spec


DeviceSpec = Annotated[str, AfterValidator(check_device_spec)]
"""A config field holding a device string, checked by :func:`check_device_spec`."""
