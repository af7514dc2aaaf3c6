"""Helpers every converter shares: named tensor lookup with clear errors, shape checks, dtype names, act-order.

Sign convention (all converters): symmetric integer checkpoints store offset-binary codes u (value u - 2^(b-1));
the standard form holds them as two's complement `intB` codes c = u XOR 2^(b-1), with a symmetric scheme. Integer
zero-point checkpoints keep `uintB` codes and float32 zero points in code units (value = (u - z) * s).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

_SCALE_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
                      torch.float8_e4m3fn: "float8e4m3", torch.float8_e5m2: "float8e5m2"}
_TORCH_SCALE_DTYPES = {v: k for k, v in _SCALE_DTYPE_NAMES.items()}


class Tensors:
    """A layer's tensors: `prefix` + local name looked up in a (possibly lazy) mapping of checkpoint names."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], prefix: str = ""):
        self.tensors = tensors
        self.prefix = prefix

    def name(self, local: str, sep: str = ".") -> str:
        if not self.prefix:
            return local
        return self.prefix + local if self.prefix.endswith(".") else self.prefix + sep + local

    def has(self, local: str, sep: str = ".") -> bool:
        return self.name(local, sep) in self.tensors

    def get(self, local: str, sep: str = ".") -> torch.Tensor:
        name = self.name(local, sep)
        if name not in self.tensors:
            raise ValueError(f"checkpoint tensor {name!r} is missing (needed for layer {self.prefix!r})")
        return self.tensors[name]

    def opt(self, local: str, sep: str = ".") -> torch.Tensor | None:
        return self.get(local, sep) if self.has(local, sep) else None


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    """ValueError naming the tensor, its shape and the expected shape."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(expected)}")


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ValueError(f"checkpoint tensor {name!r} has dtype {t.dtype}, expected one of {allowed}")


def scale_dtype_name(t: torch.Tensor, name: str) -> str:
    """The QuantScheme scale_dtype spelling of a stored scale tensor."""
    if t.dtype not in _SCALE_DTYPE_NAMES:
        raise ValueError(f"checkpoint tensor {name!r} has dtype {t.dtype}; scales must be one of "
                         f"{tuple(_SCALE_DTYPE_NAMES)}")
    return _SCALE_DTYPE_NAMES[t.dtype]


def torch_scale_dtype(name: str) -> torch.dtype:
    """torch dtype that stores scales of a QuantScheme scale_dtype (exporters)."""
    if name not in _TORCH_SCALE_DTYPES:
        raise ValueError(f"scale_dtype {name!r} has no torch storage dtype here")
    return _TORCH_SCALE_DTYPES[name]


def f32(t: torch.Tensor) -> torch.Tensor:
    """Decoded scale values as float32 (exact for every supported scale format)."""
    return t.to(torch.float32)


def offset_to_signed(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Offset-binary codes -> two's complement codes of the same value (uint8)."""
    return (u.to(torch.uint8) ^ (1 << (bits - 1))) & ((1 << bits) - 1)


def group_order(g_idx: torch.Tensor, k: int, group_size: int, name: str) -> torch.Tensor | None:
    """Act-order: the K permutation that makes groups contiguous, or None when g_idx is already k // g.

    Stored column j holds input channel perm[j]; after sorting, column j must belong to group j // group_size,
    which is what GPTQ's desc_act (g_idx = invperm // g) produces. Anything else cannot be expressed.
    """
    g_idx = g_idx.to(torch.int64).reshape(-1)
    if g_idx.numel() != k:
        raise ValueError(f"checkpoint tensor {name!r} has {g_idx.numel()} entries, expected {k} (one per input)")
    natural = torch.arange(k) // group_size
    if torch.equal(g_idx, natural):
        return None
    perm = torch.argsort(g_idx, stable=True)
    if not torch.equal(g_idx[perm], natural):
        raise ValueError(f"checkpoint tensor {name!r}: groups are not of size {group_size} after sorting by group "
                         f"index; this act-order layout is not supported")
    return perm


def g_idx_of(k_perm: torch.Tensor | None, k: int, group_size: int) -> torch.Tensor:
    """Inverse of `group_order`: the g_idx (group of each original input channel) for a stored order."""
    stored_group = torch.arange(k, dtype=torch.int32) // group_size
    if k_perm is None:
        return stored_group
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[k_perm.long()] = stored_group
    return g_idx


def config_get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    """First present key (configs spell the same field differently: bits / w_bit, group_size / q_group_size)."""
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return default


def config_int(cfg: Mapping[str, Any], *keys: str, default: Any = None, where: str = "quantization_config") -> Any:
    """`config_get` for an integer field: a value that is not a whole number raises ValueError naming the field
    (configs are written by hand and by many tools: "128" and 128.0 are accepted, "garbage" is not)."""
    for key in keys:
        if key in cfg and cfg[key] is not None:
            value = cfg[key]
            try:
                number = int(value)
                ok = not isinstance(value, bool) and (not isinstance(value, float) or value == number)
            except (TypeError, ValueError, OverflowError):
                ok = False
            if not ok:
                raise ValueError(f"{where}.{key}: got {value!r}; allowed: an integer")
            return number
    return default


def named(prefix: str, tensors: dict[str, torch.Tensor], sep: str = ".") -> dict[str, torch.Tensor]:
    """Local names -> checkpoint names under `prefix` (exporters), the inverse of `Tensors.name`."""
    t = Tensors({}, prefix)
    return {t.name(local, sep): v.contiguous() for local, v in tensors.items()}


def reciprocal(x: torch.Tensor) -> torch.Tensor:
    """float32 1/x, rounded once (formats that store a divisor: CT global scales, BitNet weight_scale)."""
    return (1.0 / x.to(torch.float64)).to(torch.float32)

