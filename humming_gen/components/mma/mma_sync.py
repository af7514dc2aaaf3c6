"""mma.sync back end (SM80+): m16n8k16 with 16-bit inputs and fp32 accumulators."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component
from humming_gen.components.ptx.wrappers import PTX_PAIR_TYPE


@attrs.frozen
class MmaSyncM16N8K16(Component):
    """Weights as the A operand (16 n x 16 k), activations as B (16 k x 8 m)."""

    template: ClassVar[str] = "mma/mma_sync_m16n8k16.cuh.j2"
    family: ClassVar[str] = "mma"
    provides: ClassVar[frozenset[str]] = frozenset({"mma_m16n8k16"})
    dtype: str

    @property
    def requires(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"mma_bf16"}) if self.dtype == "bfloat16" else frozenset()

    def extra_context(self) -> dict:
        return {"ptx_type": PTX_PAIR_TYPE[self.dtype].replace("x2", "")}
