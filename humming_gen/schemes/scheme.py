"""Quantization schemes: how a weight (and optionally an activation) is turned into codes and scales.

Weights are laid out (N, K) like torch Linear (MoE weights (E, N, K)); groups run along K. A `QuantizedWeight`
holds the standard form every converter produces and every kernel consumes: raw element codes plus decoded
scales, zero points and a global scale as float32 tensors (exact: every supported scale format fits float32).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING, Any, Literal

import attrs
import torch

from humming_gen.config.limits import MAX_K, MAX_N
from humming_gen.formats import DType, dtype, format_spec

if TYPE_CHECKING:  # quantize.py imports this module
    from humming_gen.schemes.quantize import QuantizedActivation

Granularity = Literal["channel", "group", "block", "tensor"]
_GRANULARITIES = ("channel", "group", "block", "tensor")
SCALE_DTYPES = ("bfloat16", "float16", "float32", "float8e4m3", "float8e5m2", "float8e8m0")
MX_SCALE_RULES = ("rceil", "floor", "even")


def _dtype_converter(field: str, optional: bool = False):
    """attrs converter resolving a format name; its errors name the field (converters do not know it)."""

    def convert(value: "str | DType | None") -> DType | None:
        if value is None and optional:
            return None
        try:
            return dtype(value)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{field}: {exc}") from None

    return convert


def _block_tuple(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return (value, value)
    try:
        return tuple(int(v) for v in value)  # type: ignore[return-value]
    except (TypeError, ValueError):
        raise ValueError(f"QuantScheme.block_size must be an int or (bn, bk), got {value!r}") from None


def _check_size(field: str, value: Any, limit: int, dim: str) -> None:
    """A group or block side: a positive int no longer than the largest kernel dimension it divides (a longer
    one is the same as one scale for the whole dimension, and its generated constants would overflow)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise ValueError(f"{field}: got {value!r}; allowed: an int in [1, {limit}] (the largest {dim} a kernel "
                         f"indexes, humming_gen/config/limits.py)")


@attrs.frozen
class ActivationScheme:
    """Dynamic quantization of activations (M, K): per token (row), per group of K, or per tensor.

    scale_rule applies to e8m0 scales (MX): "rceil" (Humming, cuBLAS) or "floor" (OCP spec).
    static_scale: a per-tensor scale read from a checkpoint (input_scale); None = computed at run time.
    """

    dtype: DType = attrs.field(converter=_dtype_converter("ActivationScheme.dtype"))
    granularity: str = "token"
    group_size: int | None = None
    scale_dtype: DType = attrs.field(default="float32", converter=_dtype_converter("ActivationScheme.scale_dtype"))
    scale_rule: str = "rceil"
    global_scale: bool = False

    def __attrs_post_init__(self) -> None:
        if self.dtype.bits > 8:
            raise ValueError(f"ActivationScheme.dtype: quantized activations have <= 8 bits, got {self.dtype.name}")
        if self.granularity not in ("token", "group", "tensor"):
            raise ValueError(f"ActivationScheme.granularity must be 'token', 'group' or 'tensor', got {self.granularity!r}")
        if self.granularity == "group":
            _check_size("ActivationScheme.group_size", self.group_size, MAX_K, "K")
        elif self.group_size is not None:
            raise ValueError(f"ActivationScheme.group_size is only for granularity 'group', got {self.group_size!r} "
                             f"with granularity {self.granularity!r}")
        if self.scale_dtype.name not in SCALE_DTYPES:
            raise ValueError(f"ActivationScheme.scale_dtype must be one of {SCALE_DTYPES}, got {self.scale_dtype.name}")
        if self.scale_rule not in MX_SCALE_RULES:
            raise ValueError(f"ActivationScheme.scale_rule must be one of {MX_SCALE_RULES}, got {self.scale_rule!r}")

    def quantize(self, x: torch.Tensor) -> "QuantizedActivation":
        """Quantize activations (..., K) dynamically (or with `static_scale`) -> codes + scales."""
        from humming_gen.schemes.quantize import quantize_activation

        return quantize_activation(self, x)

    def to_dict(self) -> dict:
        return {"dtype": format_spec(self.dtype), "granularity": self.granularity, "group_size": self.group_size,
                "scale_dtype": self.scale_dtype.name, "scale_rule": self.scale_rule,
                "global_scale": self.global_scale}

    @classmethod
    def from_dict(cls, d: dict) -> "ActivationScheme":
        return cls(**d)


@attrs.frozen
class QuantScheme:
    """How a (N, K) weight is quantized.

    weight: element format (`int4`, `uint4`, `float4e2m1`, a registered custom format, ...).
    granularity: "channel" (one scale per row n), "group" (per n and per `group_size` consecutive k),
        "block" (per `block_size` = (bn, bk) tile), "tensor" (one scale). Default: "group" when group_size is
        given, "block" when block_size is given, else "channel".
    zero_point: None (symmetric), "int" (integer zero point in code units, e.g. uint4 + zp, AWQ/GPTQ asym) or
        "float" (zero point stored as a float, in code units).
    global_scale: a second per-tensor fp32 scale multiplied into every scale (NVFP4).
    scale_rule: for e8m0 scales, the MX exponent rule: "rceil" (default; Humming, cuBLAS), "floor" (OCP), "even".
    activation: None for 16-bit activations, else how activations are quantized.
    """

    weight: DType = attrs.field(converter=_dtype_converter("QuantScheme.weight"))
    granularity: str | None = None
    group_size: int | None = None
    block_size: tuple[int, int] | None = attrs.field(default=None, converter=_block_tuple)
    scale_dtype: DType = attrs.field(default="bfloat16", converter=_dtype_converter("QuantScheme.scale_dtype"))
    zero_point: str | None = None
    zero_point_dtype: DType | None = attrs.field(default=None,
                                                 converter=_dtype_converter("QuantScheme.zero_point_dtype", True))
    global_scale: bool = False
    scale_rule: str = "rceil"
    activation: ActivationScheme | None = None

    def __attrs_post_init__(self) -> None:
        gran = self.granularity
        if gran is None:
            gran = "group" if self.group_size is not None else "block" if self.block_size is not None else "channel"
            object.__setattr__(self, "granularity", gran)
        if gran not in _GRANULARITIES:
            raise ValueError(f"QuantScheme.granularity must be one of {_GRANULARITIES}, got {gran!r}")
        if self.weight.bits > 8:
            raise ValueError(f"QuantScheme.weight must be a format of <= 8 bits, got {self.weight.name} "
                             f"({self.weight.bits} bits)")
        if gran == "group":
            _check_size("QuantScheme.group_size", self.group_size, MAX_K, "K")
        elif self.group_size is not None:
            raise ValueError(f"QuantScheme.group_size is only for granularity 'group', got group_size="
                             f"{self.group_size!r} with granularity {gran!r}")
        if gran == "block":
            if self.block_size is None or len(self.block_size) != 2:
                raise ValueError(f"QuantScheme.block_size must be (bn, bk) with positive ints for granularity "
                                 f"'block', got {self.block_size!r}")
            _check_size("QuantScheme.block_size[0] (bn)", self.block_size[0], MAX_N, "N")
            _check_size("QuantScheme.block_size[1] (bk)", self.block_size[1], MAX_K, "K")
        elif self.block_size is not None:
            raise ValueError(f"QuantScheme.block_size is only for granularity 'block', got {self.block_size!r} "
                             f"with granularity {gran!r}")
        if self.scale_dtype.name not in SCALE_DTYPES:
            raise ValueError(f"QuantScheme.scale_dtype must be one of {SCALE_DTYPES}, got {self.scale_dtype.name}")
        if self.zero_point not in (None, "int", "float"):
            raise ValueError(f"QuantScheme.zero_point must be None, 'int' or 'float', got {self.zero_point!r}")
        if self.zero_point is not None:
            if not self.weight.is_int or self.weight.signed:
                raise ValueError(f"QuantScheme.zero_point needs an unsigned integer weight (uintB), "
                                 f"got weight={self.weight.name}")
            if gran == "tensor":
                raise ValueError("QuantScheme.zero_point is not supported with granularity 'tensor'")
        elif self.zero_point_dtype is not None:
            raise ValueError("QuantScheme.zero_point_dtype given without zero_point")
        if self.scale_dtype.name == "float8e8m0" and self.scale_rule not in MX_SCALE_RULES:
            raise ValueError(f"QuantScheme.scale_rule must be one of {MX_SCALE_RULES}, got {self.scale_rule!r}")
        if self.scale_rule not in MX_SCALE_RULES:
            raise ValueError(f"QuantScheme.scale_rule must be one of {MX_SCALE_RULES}, got {self.scale_rule!r}")
        if self.activation is not None and not isinstance(self.activation, ActivationScheme):
            raise TypeError(f"QuantScheme.activation must be an ActivationScheme or None, "
                            f"got {type(self.activation).__name__}")

    # --- shapes -----------------------------------------------------------------------------
    def scale_shape(self, n: int, k: int) -> tuple[int, int]:
        """Shape of the (per expert) scale tensor for a (n, k) weight."""
        if self.granularity == "channel":
            return (n, 1)
        if self.granularity == "group":
            return (n, math.ceil(k / self.group_size))
        if self.granularity == "block":
            bn, bk = self.block_size
            return (math.ceil(n / bn), math.ceil(k / bk))
        return (1, 1)

    def expand_scales(self, t: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """Scale-shaped tensor (..., a, b) -> one value per weight element (..., n, k)."""
        if self.granularity == "channel":
            return t.expand(*t.shape[:-2], n, k)
        if self.granularity == "group":
            return t.repeat_interleave(self.group_size, dim=-1)[..., :k]
        if self.granularity == "block":
            bn, bk = self.block_size
            return t.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
        return t.expand(*t.shape[:-2], n, k)

    def quantize(self, w: torch.Tensor) -> "QuantizedWeight":
        """Round-to-nearest quantization of a float (N, K) or (E, N, K) weight with this scheme's scale rules."""
        from humming_gen.schemes.quantize import quantize_weight

        return quantize_weight(self, w)

    @property
    def is_symmetric(self) -> bool:
        return self.zero_point is None

    def to_dict(self) -> dict:
        """JSON form; custom formats are written out in full (`format_spec`), so it replays in any process."""
        return {"weight": format_spec(self.weight), "granularity": self.granularity, "group_size": self.group_size,
                "block_size": list(self.block_size) if self.block_size else None,
                "scale_dtype": self.scale_dtype.name, "zero_point": self.zero_point,
                "zero_point_dtype": format_spec(self.zero_point_dtype) if self.zero_point_dtype else None,
                "global_scale": self.global_scale, "scale_rule": self.scale_rule,
                "activation": self.activation.to_dict() if self.activation else None}

    @classmethod
    def from_dict(cls, d: dict) -> "QuantScheme":
        d = dict(d)
        if d.get("activation") is not None:
            d["activation"] = ActivationScheme.from_dict(d["activation"])
        return cls(**d)

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def summary(self) -> str:
        if self.granularity == "group":
            gran = f"g{self.group_size}"
        elif self.granularity == "block":
            gran = f"block{self.block_size[0]}x{self.block_size[1]}"
        else:
            gran = self.granularity
        parts = [f"weight={self.weight.name}", f"scale={self.scale_dtype.name}/{gran}",
                 f"zero_point={self.zero_point or 'no'}"]
        if self.global_scale:
            parts.append("global_scale=yes")
        act = self.activation
        parts.append(f"act={act.dtype.name}/{act.granularity}" if act else "act=16-bit")
        return " ".join(parts)


def first_nonfinite(t: torch.Tensor) -> tuple[tuple[int, ...], float] | None:
    """Index and value of the first NaN / inf element of a float tensor (row-major order), or None."""
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    return index, float(t[index])


def _index_text(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]" if index else ""


def _check_finite(name: str, t: torch.Tensor | None) -> None:
    """ValueError naming the first non-finite element of a scale-like tensor."""
    if t is None or not t.dtype.is_floating_point:
        return
    found = first_nonfinite(t)
    if found is not None:
        index, value = found
        raise ValueError(f"QuantizedWeight.{name}{_index_text(index)} is {value}; scales, zero points and global "
                         f"scales must be finite")


def _check_finite_codes(fmt: DType, codes: torch.Tensor) -> None:
    """ValueError naming the first code that decodes to NaN / inf (fp8 checkpoints can hold them)."""
    if not fmt.is_float or not fmt.has_nan or fmt.bits > 8:
        return
    table = fmt.code_values()
    bad_codes = [c for c in range(fmt.num_codes) if not math.isfinite(float(table[c]))]
    masked = codes & ((1 << fmt.bits) - 1)
    bad = torch.zeros(codes.shape, dtype=torch.bool, device=codes.device)
    for c in bad_codes:
        bad |= masked == c
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        code = int(masked[index])
        raise ValueError(f"QuantizedWeight.codes{_index_text(index)} = {code:#x} is {float(table[code])} in "
                         f"{fmt.name}; weights must be finite")


@attrs.define(eq=False)
class QuantizedWeight:
    """The standard form of a quantized (N, K) or (E, N, K) weight.

    codes: integer tensor of raw element bit patterns (uint8 for <= 8 bits), shape (N, K) / (E, N, K).
    scales: float32, shape scheme.scale_shape(n, k) (with a leading E), decoded values of scheme.scale_dtype.
    zero_points: float32 like scales (in code units: value = (decode(code) - zero_point) * scale), or None.
    global_scale: float32 scalar (or (E,)) multiplied into every element, or None.
    k_perm: act-order permutation: stored column j holds input channel k_perm[j] (None = identity). The
        kernel path permutes activation columns with it; `dequantize()` returns the original column order.
    channel_scale: an optional second per-row (N,) / (E, N) float32 scale (fused shards with one per-tensor
        scale each, e.g. q/k/v of an FP8 checkpoint), multiplied into every element of its row.
    input_scale: static activation scale from a checkpoint (float32 scalar), or None.
    """

    scheme: QuantScheme
    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    k_perm: torch.Tensor | None = None
    channel_scale: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None

    def __attrs_post_init__(self) -> None:
        self.validate()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    @property
    def n(self) -> int:
        return self.codes.shape[-2]

    @property
    def k(self) -> int:
        return self.codes.shape[-1]

    @property
    def num_experts(self) -> int:
        return self.codes.shape[0] if self.codes.dim() == 3 else 1

    def validate(self) -> None:
        """Shape and dtype consistency; raises ValueError naming the tensor and the expected shape."""
        s = self.scheme
        if self.codes.dim() not in (2, 3):
            raise ValueError(f"QuantizedWeight.codes must be (N, K) or (E, N, K), got shape {tuple(self.codes.shape)}")
        if self.codes.dtype.is_floating_point or self.codes.dtype == torch.bool:
            raise ValueError(f"QuantizedWeight.codes must be an integer tensor of raw codes, got {self.codes.dtype}")
        lead = tuple(self.codes.shape[:-2])
        expected = lead + s.scale_shape(self.n, self.k)
        if tuple(self.scales.shape) != expected:
            raise ValueError(f"QuantizedWeight.scales has shape {tuple(self.scales.shape)}, expected {expected} for "
                             f"{s.granularity} scales of a {tuple(self.codes.shape)} weight")
        if s.zero_point is not None:
            if self.zero_points is None:
                raise ValueError(f"QuantizedWeight.zero_points missing: scheme has zero_point={s.zero_point!r}")
            if tuple(self.zero_points.shape) != expected:
                raise ValueError(f"QuantizedWeight.zero_points has shape {tuple(self.zero_points.shape)}, "
                                 f"expected {expected}")
        elif self.zero_points is not None:
            raise ValueError("QuantizedWeight.zero_points given but the scheme is symmetric")
        if s.global_scale and self.global_scale is None:
            raise ValueError("QuantizedWeight.global_scale missing: scheme has global_scale=True")
        if self.k_perm is not None and tuple(self.k_perm.shape) != (self.k,):
            raise ValueError(f"QuantizedWeight.k_perm has shape {tuple(self.k_perm.shape)}, expected ({self.k},)")
        if self.channel_scale is not None and tuple(self.channel_scale.shape) != lead + (self.n,):
            raise ValueError(f"QuantizedWeight.channel_scale has shape {tuple(self.channel_scale.shape)}, "
                             f"expected {lead + (self.n,)}")
        # Non-finite values are refused here, where every quantizer and converter meets, so no kernel path
        # (or its scale-range checks) ever sees one.
        for name in ("scales", "zero_points", "global_scale", "channel_scale", "input_scale"):
            _check_finite(name, getattr(self, name))
        _check_finite_codes(s.weight, self.codes)

    def element_values(self) -> torch.Tensor:
        """Decoded element values (float32), before zero points and scales, in stored column order."""
        return self.scheme.weight.decode(self.codes)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Exact dequantized weight in original column order: (value - zero_point) * scale * global scale."""
        s = self.scheme
        n, k = self.n, self.k
        w = self.element_values().to(torch.float64)
        if self.zero_points is not None:
            w = w - s.expand_scales(self.zero_points.to(torch.float64), n, k)
        w = w * s.expand_scales(self.scales.to(torch.float64), n, k)
        if self.channel_scale is not None:
            w = w * self.channel_scale.to(torch.float64)[..., :, None]
        if self.global_scale is not None:
            g = self.global_scale.to(torch.float64)
            w = w * (g.reshape(-1, 1, 1) if g.numel() > 1 else g.reshape(()))
        if self.k_perm is not None:
            out = torch.empty_like(w)
            out[..., self.k_perm.long()] = w
            w = out
        return w.to(dtype)

    def shard(self, dim: int, rank: int, world_size: int) -> "QuantizedWeight":
        """Rank `rank`'s tensor-parallel part: dim=0 splits N (column-parallel, outputs concatenate), dim=1 splits
        K (row-parallel, outputs sum). Refuses a split that cuts a group or block (humming_gen.schemes.shard)."""
        from humming_gen.schemes.shard import shard_weight

        return shard_weight(self, dim, rank, world_size)

    def to(self, device: "torch.device | str") -> "QuantizedWeight":
        def mv(t):
            return None if t is None else t.to(device)

        return QuantizedWeight(self.scheme, self.codes.to(device), self.scales.to(device), mv(self.zero_points),
                               mv(self.global_scale), mv(self.k_perm), mv(self.channel_scale), mv(self.input_scale))
