"""bf16 autocast only where the device runs bf16 natively (emulated bf16 is far slower on CPUs)."""

from __future__ import annotations

import torch

from privret.models import device


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
        monkeypatch.setattr(generator, "native_bf16", lambda _device, native=native: native)
        gen = generator.load_generator(str(tiny_llama_dir), bf16=True)
        assert gen.bf16 is native
        assert generator.load_generator(str(tiny_llama_dir), bf16=False).bf16 is False


def test_native_bf16_on_cpu_is_onednn_support():
    assert device.native_bf16("cpu") is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
