"""wgmma back end (sm_90a): m64nNk16 with the weights as the register A operand and the tokens on N (swap-AB),
so M = 8..256 token tiles need no padding to 64 rows."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field
from humming_gen.components.ptx.wrappers import PTX_PAIR_TYPE

WGMMA_N = tuple(range(8, 257, 8))  # token counts an m64nNk16 instruction takes


@attrs.frozen
class WgmmaRS(Component):
    """Register-A, shared-B warpgroup MMA over `n` tokens."""

    template: ClassVar[str] = "mma/wgmma_rs.cuh.j2"
    family: ClassVar[str] = "mma"
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma"})
    dtype: str
    n: int

    def __attrs_post_init__(self) -> None:
        if self.n not in WGMMA_N:
            raise ValueError(f"wgmma N={self.n}: must be a multiple of 8 in 8..256")

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_accumulators", f"wgmma_m64n{self.n}k16"})

    def extra_context(self) -> dict:
        regs = self.n // 2
        return {"ptx_type": PTX_PAIR_TYPE[self.dtype].replace("x2", ""),
                "d_list": ", ".join(f"%{i}" for i in range(regs)),
                "a_list": ", ".join(f"%{regs + i}" for i in range(4)),
                "d_operands": ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(regs))}


@attrs.frozen
class WgmmaSS(WgmmaRS):
    """Shared-A, shared-B warpgroup MMA over `n` tokens with 16-bit operands: the weights come dequantized from the
    stage's widened panels (b_operand='widened') through a descriptor instead of each warp's registers."""

    template: ClassVar[str] = "mma/wgmma_ss.cuh.j2"


WGMMA_8BIT_TYPE = {"int8": "s8", "float8e4m3": "e4m3", "float8e5m2": "e5m2"}


@attrs.frozen
class WgmmaRS8(Component):
    """Register-A, shared-B warpgroup MMA over `n` tokens with 8-bit operands (k32): s32 partial sums for int8 x
    int8, fp32 for fp8 x fp8. The partial sums are promoted into fp32 accumulators by the pipeline."""

    template: ClassVar[str] = "mma/wgmma_rs8.cuh.j2"
    family: ClassVar[str] = "mma"
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma"})
    weight: str
    activation: str
    n: int

    def __attrs_post_init__(self) -> None:
        if self.n not in WGMMA_N:
            raise ValueError(f"wgmma N={self.n}: must be a multiple of 8 in 8..256")
        if self.weight == "int8" and self.n > 32 and self.n % 16:
            raise ValueError(f"wgmma N={self.n} with integer operands: N must be 8, 16, 24, 32 or a multiple of 16")
        kinds = {self.weight.startswith("int"), self.activation.startswith("int")}
        if self.weight not in WGMMA_8BIT_TYPE or self.activation not in WGMMA_8BIT_TYPE or len(kinds) != 1:
            raise ValueError(f"wgmma k32 multiplies two int8 or two fp8 operands, got {self.weight} x "
                             f"{self.activation}")

    @property
    def integer(self) -> bool:
        return self.weight == "int8"

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_partials", f"wgmma_m64n{self.n}k32"})

    def extra_context(self) -> dict:
        regs = self.n // 2
        a, w = WGMMA_8BIT_TYPE[self.activation], WGMMA_8BIT_TYPE[self.weight]
        # the instruction's operand order is A (weights) then B (activation tokens)
        shape = f"s32.{w}.{a}" if self.integer else f"f32.{w}.{a}"
        constraint = "r" if self.integer else "f"
        return {"shape": shape, "ctype": "int" if self.integer else "float", "constraint": constraint,
                "scale_args": "" if self.integer else ", 1, 1",
                "d_list": ", ".join(f"%{i}" for i in range(regs)),
                "a_list": ", ".join(f"%{regs + i}" for i in range(4)),
                "d_operands": ", ".join(f'"+{constraint}"(d[{i // 4}][{i % 4}])' for i in range(regs))}


@attrs.frozen
class WgmmaSS8(WgmmaRS8):
    """Shared-A, shared-B warpgroup MMA over `n` tokens with 8-bit operands (k32): the weights come from shared
    memory in wgmma's canonical layout (BLayoutSw128 panels) instead of each warp's registers, so no thread loads
    weight fragments and the MMA may run while the warpgroup does other work."""

    template: ClassVar[str] = "mma/wgmma_ss8.cuh.j2"
    # the tokens are the A operand (64 of them a warpgroup) and the weights B, `n` weight rows (TuningConfig.tokens_on
    # 'm'); else the weights are A (64 rows) and the tokens B, `n` of them
    tokens_a: bool = option_field()

    def extra_context(self) -> dict:
        context = super().extra_context()
        if self.tokens_a:  # the instruction's types are A's then B's
            kind = "s32" if self.integer else "f32"
            context["shape"] = f"{kind}.{WGMMA_8BIT_TYPE[self.activation]}.{WGMMA_8BIT_TYPE[self.weight]}"
        return context

