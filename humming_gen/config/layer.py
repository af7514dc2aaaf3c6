"""`LayerConfig`: what the weights are (shape, experts, quantization scheme, bias, dtypes).

The scheme's own fields are validated by `QuantScheme`; here only what couples the scheme to the layer's
shape is checked (scale groups and blocks must tile K).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from humming_gen.config.limits import MAX_K, MAX_N
from humming_gen.config.validate import JsonConfig, check_bool, check_choice, check_int, fail, raise_reasons
from humming_gen.formats import DType, dtype as _resolve_dtype

if TYPE_CHECKING:
    from humming_gen.schemes import QuantScheme

DTYPES = ("bfloat16", "float16")
OUT_DTYPES = ("bfloat16", "float16", "float32")


def _dtype_name(value: Any) -> Any:
    """Accept a DType or an alias ("bf16"); anything unresolvable is left for the validator to report."""
    if isinstance(value, DType):
        return value.name
    if isinstance(value, str):
        try:
            return _resolve_dtype(value).name
        except ValueError:
            return value
    return value


def _scheme(value: Any) -> Any:
    """Accept a QuantScheme, its to_dict() form, or a preset name such as "w4a16-int4-g128"."""
    from humming_gen.schemes import QuantScheme

    if isinstance(value, str):
        from humming_gen.schemes.presets import preset

        try:
            return preset(value)
        except (KeyError, ValueError) as e:
            fail("LayerConfig", "scheme", value, f"a QuantScheme or a preset name ({e})")
    if isinstance(value, Mapping):
        return QuantScheme.from_dict(value)
    return value


@attrs.frozen(hash=False)
class LayerConfig(JsonConfig):
    """One linear layer (or MoE layer of `num_experts` weights) as the kernel sees it.

    n, k: weight shape (N, K), out = x @ W.T, for each expert.
    scheme: a QuantScheme, its dict form or a preset name.
    num_experts: 1 for a dense layer. top_k: experts per token (<= num_experts).
    has_bias: a per-output-column bias is added in the epilogue.
    dtype: activation / compute dtype ("bfloat16" | "float16"); out_dtype: output dtype, defaults to dtype.
    fold_scales: the e8m0 group scales fold into the e4m3 weight operand of the warp-specialized 8-bit kernels (each
    row's exponents fit an 11-binade window; QuantLinear decides it from the data,
    humming_gen.components.numeric.exponent_fold); other kernels read the group scales as before.
    """

    n: int
    k: int
    scheme: "QuantScheme" = attrs.field(converter=_scheme)
    num_experts: int = attrs.field(default=1, kw_only=True)
    top_k: int = attrs.field(default=1, kw_only=True)
    has_bias: bool = attrs.field(default=False, kw_only=True)
    dtype: str = attrs.field(default="bfloat16", kw_only=True, converter=_dtype_name)
    out_dtype: str = attrs.field(default=attrs.Factory(lambda self: self.dtype, takes_self=True), kw_only=True,
                                 converter=_dtype_name)
    fold_scales: bool = attrs.field(default=False, kw_only=True, metadata={"listed_when_set": True})
    _key_cache: str | None = attrs.field(init=False, default=None, eq=False, repr=False)

    __hash__ = JsonConfig.__hash__

    def __attrs_post_init__(self) -> None:
        from humming_gen.schemes import QuantScheme

        o = "LayerConfig"
        check_int(o, "n", self.n, lo=1, hi=MAX_N, why="generated kernels index N with 32-bit ints")
        check_int(o, "k", self.k, lo=1, hi=MAX_K,
                  why="the packed-weight stride of a 512-column block must stay below 2^31")
        if not isinstance(self.scheme, QuantScheme):
            fail(o, "scheme", self.scheme, "a QuantScheme, its dict form or a preset name", TypeError)
        check_int(o, "num_experts", self.num_experts, lo=1)
        check_int(o, "top_k", self.top_k, lo=1)
        check_bool(o, "has_bias", self.has_bias)
        check_choice(o, "dtype", self.dtype, DTYPES)
        check_choice(o, "out_dtype", self.out_dtype, OUT_DTYPES)
        check_bool(o, "fold_scales", self.fold_scales)
        raise_reasons(o, self._consistency_reasons())

    def _consistency_reasons(self) -> list[str]:
        reasons = []
        if self.top_k > self.num_experts:
            reasons.append(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        s = self.scheme
        # NOTE: a scale group or block may straddle the end of K (K=300 with group 128): the last group is
        # partial, its scale is still stored, and kernels pad K with zeros.
        act = s.activation
        if act is not None and act.granularity == "group" and self.k % act.group_size:
            reasons.append(f"k={self.k} is not a multiple of the activation scheme's group_size={act.group_size}")
        if self.fold_scales:
            from humming_gen.components.numeric.exponent_fold import fold_reasons

            reasons += [f"fold_scales=True: {r}" for r in fold_reasons(s)]
        return reasons

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["scheme"] = self.scheme.to_dict()
        return d

    def summary(self) -> str:
        """One line for the generated source's header; holds every field."""
        moe = f"experts={self.num_experts} top_k={self.top_k} " if self.is_moe else ""
        fold = " fold_scales=yes" if self.fold_scales else ""
        return (f"layer   n={self.n} k={self.k} {moe}{self.scheme.summary()} dtype={self.dtype} "
                f"out={self.out_dtype} bias={'yes' if self.has_bias else 'no'}{fold}")
