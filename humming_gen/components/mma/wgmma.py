"""wgmma back end (sm_90a): m64nNk16 with the weights as the register A operand and the tokens on N (swap-AB),
so M = 8..256 token tiles need no padding to 64 rows."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component
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
