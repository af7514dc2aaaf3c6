"""Thin inline-PTX wrappers, one instruction family each. A kernel's source holds only the wrappers its
components list in `ptx`; `codegen.compose` collects them."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component

PTX_PAIR_TYPE = {"bfloat16": "bf16x2", "float16": "f16x2"}
PTX_SCALAR_TYPE = {"bfloat16": "bf16", "float16": "f16"}


@attrs.frozen
class SmemAddress(Component):
    template: ClassVar[str] = "ptx/smem_address.cuh.j2"
    family: ClassVar[str] = "ptx"


@attrs.frozen
class CpAsync(Component):
    template: ClassVar[str] = "ptx/cp_async.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})


@attrs.frozen
class Ldmatrix(Component):
    template: ClassVar[str] = "ptx/ldmatrix.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"ldmatrix"})
    x4: bool = True  # pairs of m8 tiles
    x2: bool = False  # a last, unpaired m8 tile


@attrs.frozen
class Prmt(Component):
    template: ClassVar[str] = "ptx/prmt.cuh.j2"
    family: ClassVar[str] = "ptx"


@attrs.frozen
class AndOr(Component):
    """(a & mask) | bits as one LOP3, written out (NVRTC 13.0 splits the C expression into two)."""

    template: ClassVar[str] = "ptx/and_or.cuh.j2"
    family: ClassVar[str] = "ptx"


@attrs.frozen
class AndXor(Component):
    """(a & mask) ^ bits as one LOP3."""

    template: ClassVar[str] = "ptx/and_xor.cuh.j2"
    family: ClassVar[str] = "ptx"


@attrs.frozen
class Fma2(Component):
    """Packed 16-bit fma; the only packed bf16 arithmetic that exists from SM80 on."""

    template: ClassVar[str] = "ptx/fma2.cuh.j2"
    family: ClassVar[str] = "ptx"
    dtype: str

    def extra_context(self) -> dict:
        return {"ptx_type": PTX_PAIR_TYPE[self.dtype]}


@attrs.frozen
class CvtScalar(Component):
    """fp32 -> output type (to_float reads the compute type, e.g. a bias)."""

    template: ClassVar[str] = "ptx/cvt_scalar.cuh.j2"
    family: ClassVar[str] = "ptx"
    dtype: str
    out_dtype: str
    to_float: bool

    def extra_context(self) -> dict:
        return {"ptx_scalar": PTX_SCALAR_TYPE[self.dtype], "ptx_out": PTX_SCALAR_TYPE.get(self.out_dtype)}


@attrs.frozen
class GridDependency(Component):
    """griddepcontrol: overlap the prologue with the previous kernel's tail."""

    template: ClassVar[str] = "ptx/grid_dependency.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"pdl"})


@attrs.frozen
class GlobalSync(Component):
    """Arrival counter, gpu-scope fences and L2 loads for the split-K hand-off."""

    template: ClassVar[str] = "ptx/global_sync.cuh.j2"
    family: ClassVar[str] = "ptx"


WRAPPERS: dict[str, type[Component]] = {
    "smem_address": SmemAddress, "cp_async": CpAsync, "ldmatrix": Ldmatrix, "prmt": Prmt, "and_or": AndOr,
    "and_xor": AndXor, "fma2": Fma2, "cvt_scalar": CvtScalar, "global_sync": GlobalSync, "grid_dependency": GridDependency,
}
TYPED = {"fma2"}


def wrapper(name: str, dtype: str, out_dtype: str, bias: bool, m_tiles: int) -> Component:
    cls = WRAPPERS[name]
    if name == "ldmatrix":
        return cls(x4=m_tiles >= 2, x2=m_tiles % 2 == 1)
    if name == "cvt_scalar":
        return cls(dtype=dtype, out_dtype=out_dtype, to_float=bias)
    return cls(dtype=dtype) if name in TYPED else cls()
