"""The compute device, chosen once per run, and the number formats it runs fast.

``--device`` (``device`` in a pipeline or federated config): ``auto`` (default: the first CUDA GPU when
``torch.cuda.is_available()``, else the CPU), ``cpu``, ``cuda`` or ``cuda:N`` (refused with one line where absent).
Under ``torchrun`` ``auto`` and ``cuda`` mean GPU ``LOCAL_RANK``; ``cuda:N`` is taken as written.

The device is a placement, not a training setting: it is in no config, fingerprint or checkpoint, so a run resumes
on another device, and no ledger depends on it. :func:`use_device` sets it for a command; every model loader puts
its model there and batches follow the model. DP noise is drawn on the CPU (a CPU ``torch.Generator`` or the OS
CSPRNG) and moved to the gradient's device, so its source and secrecy are the same everywhere.

Autocast is bf16 where the device runs it natively (:func:`native_bf16`: Ampere or later GPUs, CPUs with
AVX512-BF16 or AMX), else none (float32). fp16 is not used: its loss scaling skips steps whose gradients overflow,
and under DP-SGD a skipped step is still charged while clipping would act on scaled gradients.
"""

from __future__ import annotations

import contextlib

import torch

from privret.distributed import launched
from privret.models.device_spec import check_device_spec

_current = "auto"  # what load_encoder / load_generator use when given no device; set by use_device


def resolve_device(spec: str | torch.device | None = None) -> torch.device:
    """The ``torch.device`` that ``spec`` names on this machine (None: the one :func:`use_device` set).

    ``auto`` is CUDA when available, else the CPU. ValueError (one line) for a malformed string, for
    ``cuda`` without CUDA, and for ``cuda:N`` beyond the GPUs present.
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = check_device_spec(_current if spec is None else spec)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if spec == "cuda" and launched().distributed:
        device = torch.device("cuda", launched().local_rank)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"'{spec}' asked for, but CUDA is not available on this machine "
                             f"(torch {torch.__version__}, torch.cuda.is_available() is False); use cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"'{spec}' asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


@contextlib.contextmanager
def use_device(spec: str):
    """Within the block, models loaded without a device of their own go to ``spec`` (checked first)."""
    global _current
    resolve_device(spec)
    previous, _current = _current, spec
    try:
        yield resolve_device(spec)
    finally:
        _current = previous


def native_bf16(device: str | torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively, so that bf16 autocast is faster.

    CUDA: ``torch.cuda.is_bf16_supported(including_emulation=False)`` (PyTorch would otherwise
    report emulated bf16 on pre-Ampere GPUs as supported). CPU: oneDNN's bf16 path (AVX512-BF16 or
    AMX). Without it, PyTorch emulates bf16 on the CPU, slower than float32. Every ``bf16`` setting of privret
    means "bf16 where it is native" and falls back to float32 elsewhere (never fp16: see the module docstring).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def uses_bf16(device: str | torch.device, requested: bool = True) -> bool:
    """Whether a computation that asked for bf16 (``requested``) runs under bf16 autocast on ``device``: only where
    bf16 is native. The one place privret resolves a ``bf16`` setting; everything else asks here."""
    return bool(requested) and native_bf16(device)


def precision_label(device: str | torch.device, bf16: bool = True) -> str:
    """What a computation asked for with ``bf16`` runs in on ``device``: ``"bf16-autocast"`` where bf16 is native,
    else ``"float32"``. Recorded beside evaluations, since the same command gives either on different machines."""
    return "bf16-autocast" if uses_bf16(device, bf16) else "float32"


def bf16_autocast(device: str | torch.device, requested: bool = True):
    """``torch.autocast`` to bfloat16 on ``device`` when ``requested`` and native there, else a no-op context."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(device, requested))
