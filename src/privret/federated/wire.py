"""What a FedAvg round puts on the wire: the trainable parameters only, optionally in 16 bits.

Down: the global trainable parameters ``w``, cast to the wire type to nearest; the server keeps ``w`` in float32.
Up: the update ``u = w_i - cast(w)``, cast *toward zero*, so ``|cast(u)_k| <= |u_k|`` and
``||cast(u)||_2 <= ||u||_2``: a client-side clipped update stays within its clip norm, which DP-FedAvg's sensitivity
needs (rounding to nearest could exceed it by up to ``2^-11`` relative in fp16). The server hands ``w + cast(u)``
in float32 to the strategy, so FedAvg and the DP wrappers see float32 models.

Updates travel rather than weights because a weight's fp16 spacing is the size of a few Adam steps. A float16
update is multiplied by a power of two per tensor (``max |u| 2^e`` in ``[2^14, 2^15)``), sent as
``<name>::scale``; the scale is exact, so it keeps the toward-zero property. bfloat16 needs no scale and travels
as the upper 16 bits of the float32 pattern (``uint16``). See docs/federated.md, section "What a round costs,
and what travels".
"""

from __future__ import annotations

from typing import Literal

import numpy as np

try:  # flwr is needed for the apps only
    from flwr.app import Array, ArrayRecord
except ImportError:  # pragma: no cover - exercised only without flwr installed
    Array = ArrayRecord = None

WireDtype = Literal["float32", "float16", "bfloat16"]
SCALE_SUFFIX = "::scale"


def _bf16_bits(x: np.ndarray, *, nearest: bool) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if nearest:  # round half to even on the 16 dropped bits
        bits = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (bits >> np.uint32(16)).astype(np.uint16)


def _fp16_toward_zero(x: np.ndarray) -> np.ndarray:
    y = x.astype(np.float16)
    over = np.abs(y.astype(np.float32)) > np.abs(x)
    y[over] = np.nextafter(y[over], np.float16(0))
    return y


def cast(x: np.ndarray, dtype: WireDtype, *, toward_zero: bool) -> np.ndarray:
    """``x`` (float32) in the wire type: to nearest, or toward zero (never larger in magnitude)."""
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("non-finite values cannot be sent")
    if dtype == "float32":
        return x.copy()
    if dtype == "float16":
        return _fp16_toward_zero(x) if toward_zero else x.astype(np.float16)
    if dtype == "bfloat16":
        return _bf16_bits(x, nearest=not toward_zero)
    raise ValueError(f"unknown wire dtype {dtype!r}")


def uncast(y: np.ndarray, dtype: WireDtype) -> np.ndarray:
    """The float32 value of a wire array."""
    if dtype == "bfloat16":
        return (np.asarray(y, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.asarray(y).astype(np.float32)


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in arrays.items()})


def _numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def encode_weights(weights: ArrayRecord, dtype: WireDtype) -> ArrayRecord:
    """Down: the global trainable parameters, rounded to nearest in the wire type."""
    return _record({k: cast(v, dtype, toward_zero=False) for k, v in _numpy(weights).items()})


def decode_weights(wire: ArrayRecord, dtype: WireDtype) -> ArrayRecord:
    """What the client trains from: the float32 value of the received parameters."""
    return _record({k: uncast(v, dtype) for k, v in _numpy(wire).items()})


def _fp16_scale(u: np.ndarray) -> np.float32:
    peak = float(np.max(np.abs(u))) if u.size else 0.0
    if peak == 0.0:
        return np.float32(1.0)
    return np.float32(2.0 ** int(np.clip(14 - np.floor(np.log2(peak)), -100, 100)))


def encode_update(trained: ArrayRecord, received: ArrayRecord, dtype: WireDtype) -> ArrayRecord:
    """Up: ``cast_toward_zero(trained - received)`` (float16: times a per-tensor power of two, sent beside it);
    the keys must be the same, in the same order."""
    t, r = _numpy(trained), _numpy(received)
    if list(t) != list(r):
        raise ValueError("the trained and the received parameters have different names")
    out = {}
    for k in t:
        u = t[k].astype(np.float32) - r[k].astype(np.float32)
        if dtype == "float16":
            scale = _fp16_scale(u)
            out[k] = cast(u * scale, dtype, toward_zero=True)
            out[k + SCALE_SUFFIX] = np.array([scale], dtype=np.float32)
        else:
            out[k] = cast(u, dtype, toward_zero=True)
    return _record(out)


def apply_update(master: ArrayRecord, update: ArrayRecord, dtype: WireDtype) -> ArrayRecord:
    """The client's model as the server sees it: ``master + uncast(update) / scale``, in float32."""
    m, u = _numpy(master), _numpy(update)
    scales = {k[:-len(SCALE_SUFFIX)]: float(v[0]) for k, v in u.items() if k.endswith(SCALE_SUFFIX)}
    values = {k: v for k, v in u.items() if not k.endswith(SCALE_SUFFIX)}
    if list(m) != list(values) or (dtype == "float16") != bool(scales) or (scales and set(scales) != set(m)):
        raise ValueError("a client's update does not carry the global model's parameter names")
    return _record({k: m[k].astype(np.float32) + uncast(values[k], dtype) / np.float32(scales.get(k, 1.0))
                    for k in m})
