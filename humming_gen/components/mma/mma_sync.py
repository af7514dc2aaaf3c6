"""mma.sync back end (SM80+): m16n8k16 with 16-bit inputs and fp32 accumulators; m16n8k32 with 8-bit inputs;
m16n8k64 with int4 inputs (s4)."""

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


# PTX operand types of the 8-bit mma.sync, and the accumulator each kind of operand produces.
PTX_8BIT_TYPE = {"int8": "s8", "uint8": "u8", "float8e4m3": "e4m3", "float8e5m2": "e5m2"}
FP8_PTX = {"float8e4m3": "e4m3", "float8e5m2": "e5m2"}


@attrs.frozen
class MmaSyncM16N8K32(Component):
    """8-bit weights as the A operand (16 n x 32 k), 8-bit activations as B (32 k x 8 m): s32 accumulators for
    integer operands, fp32 for fp8 ones (components.mma.atoms.MMA_SYNC_M16N8K32_8BIT)."""

    template: ClassVar[str] = "mma/mma_sync_m16n8k32.cuh.j2"
    family: ClassVar[str] = "mma"
    provides: ClassVar[frozenset[str]] = frozenset({"mma_m16n8k32"})
    weight: str      # format names: int8 / uint8 / float8e4m3 / float8e5m2
    activation: str

    def __attrs_post_init__(self) -> None:
        kinds = {name.startswith("float") for name in (self.weight, self.activation)}
        if self.weight not in PTX_8BIT_TYPE or self.activation not in PTX_8BIT_TYPE or len(kinds) != 1:
            raise ValueError(f"m16n8k32 multiplies two 8-bit integer or two fp8 formats, got {self.weight} x "
                             f"{self.activation}")

    @property
    def integer(self) -> bool:
        return not self.weight.startswith("float")

    @property
    def requires(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"mma_int8"} if self.integer else {"mma_fp8"})

    def extra_context(self) -> dict:
        acc, reg = ("s32", "r") if self.integer else ("f32", "f")
        return {"a_ptx": PTX_8BIT_TYPE[self.weight], "b_ptx": PTX_8BIT_TYPE[self.activation], "acc_ptx": acc,
                "acc_ctype": "int" if self.integer else "float", "acc_reg": reg}


@attrs.frozen
class MmaSyncM16N8K32ViaF16(Component):
    """fp8 weights (A, 16 n x 32 k) x fp8 activations (B, 32 k x 8 m) as two m16n8k16 f16 mmas with fp32
    accumulators, where the target's fp8 mma.sync is itself F2FP + HMMA (sm_90a). ptxas's own lowering computes
    each k32 product from zero and adds the accumulator with 4 FADDs; here the two halves and the k32 steps chain in
    the accumulators (no partial-sum adds). The activation fragment is widened once per k32 step
    (widen_activation_fragment); ptxas hoists its own conversions across n and m tiles too, so the F2FP count is the
    same. Same fragments in as MmaSyncM16N8K32; every e4m3 / e5m2 code is exact in f16 and products are exact, so
    only where the accumulator is added differs (inside the HMMA, as on targets with a native fp8 mma, instead of an
    FADD after it). The accumulator dependency spans the k32 steps of a promotion (longer HMMA chains than ptxas's
    lowering, whose k32 products are independent)."""

    template: ClassVar[str] = "mma/mma_sync_m16n8k32_f16.cuh.j2"
    family: ClassVar[str] = "mma"
    requires: ClassVar[frozenset[str]] = frozenset({"mma_fp8"})  # (its cvt f16x2.e4m3x2 / e5m2x2: sm_89+)
    weight: str      # float8e4m3 / float8e5m2
    activation: str

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        """The mma, the activation widening and a code converter per fp8 kind of the operands."""
        return frozenset({"mma_m16n8k32", "widen_activation_fragment"}
                         | {f"{FP8_PTX[d]}x4_to_f16" for d in (self.weight, self.activation)})

    def __attrs_post_init__(self) -> None:
        if self.weight not in FP8_PTX or self.activation not in FP8_PTX:
            raise ValueError(f"the f16 form of m16n8k32 multiplies fp8 codes, got {self.weight} x {self.activation}")

    def extra_context(self) -> dict:
        kinds = [FP8_PTX[self.weight], FP8_PTX[self.activation]]
        return {"weight_ptx": kinds[0], "activation_ptx": kinds[1], "converted": sorted(set(kinds))}


@attrs.frozen
class MmaSyncM16N8K64S4(Component):
    """int4 weights as the A operand (16 n x 64 k), int4 activations as B (64 k x 8 m), s32 accumulators
    (components.mma.atoms.MMA_SYNC_M16N8K64_S4). Operands are codes packed two per byte along k, low nibble first:
    the registers of the m16n8k32 8-bit fragments of the packed bytes."""

    template: ClassVar[str] = "mma/mma_sync_m16n8k64.cuh.j2"
    family: ClassVar[str] = "mma"
    provides: ClassVar[frozenset[str]] = frozenset({"mma_m16n8k64"})
    requires: ClassVar[frozenset[str]] = frozenset({"mma_int4"})
