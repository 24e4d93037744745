"""What a FedAvg round puts on the wire: the trainable parameters only, optionally in 16 bits.

Down (server -> client): the global model's trainable parameters ``w`` (the frozen ones never change,
and every node loads them from the same checkpoint), cast to the wire type by rounding to nearest.
The server keeps ``w`` in float32 (the master copy); the client trains from ``w' = cast(w)``.

Up (client -> server): not the trained weights but the update ``u = w_i - w'`` (float32 on the client),
cast to the wire type *toward zero*, so that ``|cast(u)_k| <= |u_k|`` for every coordinate and hence
``||cast(u)||_2 <= ||u||_2``: a client-side clipped update stays within its clip norm after the cast (a
cast to nearest could push it up to ``2^-11`` (fp16) or ``2^-8`` (bf16) relative above, and the DP-FedAvg
sensitivity would no longer hold). The server rebuilds the client's model as ``w + cast(u)`` in float32
and hands that to the strategy, so FedAvg, the DP wrappers' clipping (``w_i - w``) and their noise see
float32 models exactly as without the codec.

Why an update and not the weights in 16 bits: a weight of magnitude 0.05 has an fp16 spacing of
3e-5, the size of a few Adam steps at learning rate 3e-5; rounding trained weights would erase much
of a round's progress, while an update of 1e-4 keeps about 11 significant bits.

An update's coordinates are often below fp16's smallest normal number (6.1e-5), where fp16 keeps
only an absolute spacing of 6e-8; so a float16 update travels multiplied by a power of two per tensor
(``2^e`` with ``max |u| * 2^e`` in ``[2^14, 2^15)``), sent beside it as ``<name>::scale``. A power-of-two
scale is exact: it changes neither the toward-zero property nor anything but which values are subnormal.
bfloat16 keeps float32's exponent range and needs no scale; it has no numpy type and travels as the
upper 16 bits of the float32 pattern (``uint16``).
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
