"""The compute device and the number formats it runs fast."""

from __future__ import annotations

import torch


def native_bf16(device: str | torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively, so that bf16 autocast is faster.

    CUDA: ``torch.cuda.is_bf16_supported()``. CPU: oneDNN's bf16 path (AVX512-BF16 or AMX). Without
    it, PyTorch emulates bf16 on the CPU: a 512 x 576 x 1536 linear layer took 8.6x longer under
    bf16 autocast than in float32 on this project's 2-core AMD EPYC (AVX2 only), one thread. Every
    ``bf16`` setting of privret means "bf16 where it is native" and falls back to float32 elsewhere.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def bf16_autocast(device: str | torch.device, requested: bool = True):
    """``torch.autocast`` to bfloat16 on ``device`` when ``requested`` and native there, else a no-op context."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=requested and native_bf16(device))
