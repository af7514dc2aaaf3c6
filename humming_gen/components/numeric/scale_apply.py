"""The last dequantization step: subtract the converter bias (+ format offset or zero point), apply the group
scale. One component per strategy; each is one packed expression built from exact constants."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component
from humming_gen.components.numeric.halfbits import lanes_hex, pair_hex

NEG_ZERO = lanes_hex(0x8000)


@attrs.frozen
class _ScaleApply(Component):
    template: ClassVar[str] = "numeric/scale_apply.cuh.j2"
    family: ClassVar[str] = "numeric"
    ptx: ClassVar[tuple[str, ...]] = ("fma2",)
    provides: ClassVar[frozenset[str]] = frozenset({"dequant_pair"})
    params: ClassVar[tuple[str, ...]] = ()  # per-row group parameters the expression reads: "scale", "zero"
    dtype: str

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(self.ptx)

    def expression(self) -> str:
        raise NotImplementedError

    def description(self) -> str:
        return (self.__doc__ or "").strip().splitlines()[0]

    def extra_context(self) -> dict:
        return {"expression": self.expression(), "description": self.description(), "params": self.params}


@attrs.frozen
class SubtractOffset(_ScaleApply):
    """value = x - offset (channel/tensor scales are applied in the epilogue, group scales to partial sums)."""

    offset: float

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("fma2",) if self.offset else ()

    def expression(self) -> str:
        if self.offset == 0:
            return "x"
        return f"fma2(x, {pair_hex(1.0, self.dtype)}u, {pair_hex(-self.offset, self.dtype)}u)"


@attrs.frozen
class SubtractOffsetScale(_ScaleApply):
    """value = (x - offset) * group scale."""

    params: ClassVar[tuple[str, ...]] = ("scale",)
    offset: float

    def expression(self) -> str:
        if self.offset == 0:
            return f"fma2(x, scale, {NEG_ZERO}u)"
        return (f"fma2(fma2(x, {pair_hex(1.0, self.dtype)}u, {pair_hex(-self.offset, self.dtype)}u), scale, "
                f"{NEG_ZERO}u)")


@attrs.frozen
class IntZeroPointScale(_ScaleApply):
    """value = (x - (bias + zero point)) * group scale; `zero` holds -(bias + z), exact."""

    params: ClassVar[tuple[str, ...]] = ("scale", "zero")

    def expression(self) -> str:
        return f"fma2(fma2(x, {pair_hex(1.0, self.dtype)}u, zero), scale, {NEG_ZERO}u)"


@attrs.frozen
class IntZeroPoint(_ScaleApply):
    """value = x - (bias + zero point); the group scale is applied to fp32 partial sums later."""

    params: ClassVar[tuple[str, ...]] = ("zero",)

    def expression(self) -> str:
        return f"fma2(x, {pair_hex(1.0, self.dtype)}u, zero)"


@attrs.frozen
class FloatZeroPointScale(_ScaleApply):
    """value = (x - bias) * scale - z * scale; `zero` holds -z * scale (a float zero point)."""

    params: ClassVar[tuple[str, ...]] = ("scale", "zero")

    offset: float

    def expression(self) -> str:
        if self.offset == 0:
            return "fma2(x, scale, zero)"
        return (f"fma2(fma2(x, {pair_hex(1.0, self.dtype)}u, {pair_hex(-self.offset, self.dtype)}u), scale, zero)")
