"""Name -> DType registry: built-in names of the public contract, generic `floatXeYmZ`, and user formats."""

from __future__ import annotations

import copy
import re

from collections.abc import Mapping
from typing import Any

from humming_gen.formats.dtype import DType, FloatType, IntType, check_name

_REGISTERED: dict[str, DType] = {}

# Formats whose special values follow a standard rather than the generic "every code finite" rule.
_STANDARD: dict[str, DType] = {
    "float16": FloatType(5, 10, nan="ieee", name="float16"),
    "bfloat16": FloatType(8, 7, nan="ieee", name="bfloat16"),
    "float32": FloatType(8, 23, nan="ieee", name="float32"),
    "float8e4m3": FloatType(4, 3, nan="all_ones", name="float8e4m3"),
    "float8e5m2": FloatType(5, 2, nan="ieee", name="float8e5m2"),
    "float8e8m0": FloatType(8, 0, signed=False, nan="all_ones", subnormals=False, name="float8e8m0"),
    # Blackwell's hidden E3M4 is fn-style like E4M3FN (docs/FORMATS.md 1.7): the all-ones code is reserved, max +-30;
    # a generic reading (max 31) would let quantizers emit a code the hardware does not decode as 31.
}

_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32",
            "fp8": "float8e4m3", "float8_e4m3fn": "float8e4m3", "float8_e5m2": "float8e5m2",
            "float8_e8m0fnu": "float8e8m0", "fp4": "float4e2m1", "float4_e2m1fn": "float4e2m1"}

_INT_RE = re.compile(r"^(u?)int(\d+)$")
_FLOAT_RE = re.compile(r"^float(\d+)e(\d+)m(\d+)$")


def register_dtype(name: str, dtype: DType) -> DType:
    """Make `dtype` available as `humming_gen.dtype(name)`; the registered format keeps the given name.

    Registering a name again with the same format is a no-op; with a different one it is an error, because
    schemes, configs and cached kernels made earlier in the process name the format they were made with.
    """
    check_name(name, "register_dtype name")
    if not isinstance(dtype, DType):
        raise TypeError(f"register_dtype dtype must be a DType (FloatType/IntType), got {type(dtype).__name__}")
    if name in _STANDARD or _INT_RE.match(name) or _FLOAT_RE.match(name):
        existing = dtype_from_name(name)
        if existing != dtype and _strip(existing) != _strip(dtype):
            raise ValueError(f"register_dtype: {name!r} is a built-in format name with different semantics")
    previous = _REGISTERED.get(name)
    if previous is not None and _strip(previous) != _strip(dtype):
        raise ValueError(f"register_dtype: {name!r} is already registered as {previous.to_dict()}; got "
                         f"{dtype.to_dict()}. A registered name keeps its format: register this one under "
                         f"another name")
    if dtype.name != name:
        dtype = _renamed(dtype, name)
    _REGISTERED[name] = dtype
    return dtype


def _renamed(d: DType, name: str) -> DType:
    """Copy of `d` under another name. attrs.evolve cannot be used: FloatType/IntType have custom __init__s
    whose arguments differ from their fields (evolve passes `bits=`, which they do not take)."""
    new = copy.copy(d)
    object.__setattr__(new, "name", name)
    return new


def _strip(d: DType) -> DType:
    return _renamed(d, "")


_DICT_KEYS = {"int": ("kind", "name", "bits", "signed"),
              "float": ("kind", "name", "exponent_bits", "mantissa_bits", "signed", "bias", "nan", "subnormals")}


def dtype_from_dict(d: Mapping[str, Any]) -> DType:
    """Inverse of `DType.to_dict()`: a format described in JSON (custom formats in configs, the CLI, headers)."""
    if not isinstance(d, Mapping):
        raise TypeError(f"a format description must be a dict, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in _DICT_KEYS:
        raise ValueError(f"format description {dict(d)!r}: 'kind' must be 'int' or 'float'")
    unknown = sorted(set(d) - set(_DICT_KEYS[kind]))
    if unknown:
        raise ValueError(f"format description {dict(d)!r}: unknown keys {unknown}; allowed: "
                         f"{', '.join(_DICT_KEYS[kind])}")
    args = {key: value for key, value in d.items() if key != "kind"}
    if kind == "int":
        return IntType(**args)
    return FloatType(**args)


def format_spec(d: DType) -> "str | dict[str, Any]":
    """How a format is written in JSON: its name where any process resolves that name to the same format
    (built-in names), else its full description, so that configs and generated headers can be replayed
    where the custom format was never registered."""
    try:
        builtin = _builtin(d.name)
    except ValueError:
        builtin = None
    return d.name if builtin == d else d.to_dict()


def dtype_from_name(name: "str | DType | Mapping[str, Any]") -> DType:
    """Resolve a format name (or pass a DType through, or build one from its `to_dict()` description).
    Unknown or inconsistent names raise ValueError."""
    if isinstance(name, DType):
        return name
    if isinstance(name, Mapping):
        return dtype_from_dict(name)
    if not isinstance(name, str):
        raise TypeError(f"dtype must be a format name, a DType or a format description dict, got "
                        f"{type(name).__name__}")
    key = _ALIASES.get(name, name)
    if key in _REGISTERED:
        return _REGISTERED[key]
    return _builtin(name)


def _builtin(name: str) -> DType:
    """The built-in format of a name or alias, ignoring registered formats."""
    key = _ALIASES.get(name, name)
    if key in _STANDARD:
        return _STANDARD[key]
    m = _INT_RE.match(key)
    if m:
        bits = int(m.group(2))
        if not 1 <= bits <= 32:
            raise ValueError(f"dtype {name!r}: integer width must be 1..32 bits, got {bits}")
        return IntType(bits, signed=not m.group(1))
    m = _FLOAT_RE.match(key)
    if m:
        bits, e, mant = (int(g) for g in m.groups())
        if bits != 1 + e + mant:
            raise ValueError(f"dtype {name!r}: float{bits}e{e}m{mant} is inconsistent, "
                             f"1 sign + {e} exponent + {mant} mantissa bits = {1 + e + mant}, not {bits}")
        if bits > 8 and (e, mant) not in ((5, 10), (8, 7), (8, 23)):
            raise ValueError(f"dtype {name!r}: custom floats are limited to 8 bits (got {bits})")
        if e > 8:
            raise ValueError(f"dtype {name!r}: at most 8 exponent bits, got {e}")
        if e == 0 and mant == 0:
            raise ValueError(f"dtype {name!r}: a format needs at least one exponent or mantissa bit")
        return FloatType(e, mant)
    known = sorted(set(_STANDARD) | set(_REGISTERED))
    raise ValueError(f"unknown dtype {name!r}: expected intB/uintB (B=1..32), floatXeYmZ with X=1+Y+Z, "
                     f"one of {known}, or a custom format described in full, e.g. {{'kind': 'float', 'name': "
                     f"{name!r}, 'exponent_bits': 2, 'mantissa_bits': 2}} (register_dtype registers a name in "
                     f"this process only)")


def torch_dtype_of(d: DType):
    """The torch dtype holding this format's values directly, or None."""
    import torch

    table = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    return table.get(d.name)
