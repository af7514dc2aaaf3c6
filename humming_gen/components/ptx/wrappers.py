"""Thin inline-PTX wrappers, one instruction family each. A kernel's source holds only the wrappers its
components list in `ptx`; `codegen.compose` collects them."""

from __future__ import annotations

from typing import ClassVar

import attrs

from humming_gen.components.base import Component, option_field

PTX_PAIR_TYPE = {"bfloat16": "bf16x2", "float16": "f16x2"}
PTX_SCALAR_TYPE = {"bfloat16": "bf16", "float16": "f16"}


@attrs.frozen
class SmemAddress(Component):
    template: ClassVar[str] = "ptx/smem_address.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"smem_address"})


@attrs.frozen
class CpAsync(Component):
    """cp.async 16-byte copies; `groups`: with commit / wait groups (a warp-specialized producer completes its
    copies on an mbarrier instead)."""

    template: ClassVar[str] = "ptx/cp_async.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    groups: bool = option_field(True)

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"cp_async_16"} | ({"cp_async_commit", "cp_async_wait"} if self.groups
                                            else {"cp_async_drain"}))


@attrs.frozen
class CpAsyncWord(Component):
    """cp.async of one 4-byte word: a value per token whose rows are not 16-byte runs (activation group scales)."""

    template: ClassVar[str] = "ptx/cp_async_word.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    provides: ClassVar[frozenset[str]] = frozenset({"cp_async_4"})


@attrs.frozen
class CpAsyncDrain(Component):
    """The wait for every cp.async of a thread, alone: for producers whose only cp.asyncs are words (CpAsync without
    groups holds it beside its copy)."""

    template: ClassVar[str] = "ptx/cp_async_drain.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"cp_async"})
    provides: ClassVar[frozenset[str]] = frozenset({"cp_async_drain"})


@attrs.frozen
class Ldmatrix(Component):
    template: ClassVar[str] = "ptx/ldmatrix.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"ldmatrix"})
    x4: bool = True  # pairs of m8 tiles
    x2: bool = False  # a last, unpaired m8 tile

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"ldmatrix_x4"} if self.x4 else set()) | frozenset({"ldmatrix_x2"} if self.x2 else set())


@attrs.frozen
class Stmatrix(Component):
    """stmatrix .trans: accumulator fragments into shared memory as rows of the transposed tile (a staged store)."""

    template: ClassVar[str] = "ptx/stmatrix.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"stmatrix"})
    x1: bool = False  # one matrix: a 16-row tile's 8 gated features
    x2: bool = True  # two: a 16-row tile's rows g and g + 8

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"stmatrix_x1_trans"} if self.x1 else set()) | frozenset({"stmatrix_x2_trans"} if self.x2
                                                                                   else set())


@attrs.frozen
class Prmt(Component):
    template: ClassVar[str] = "ptx/prmt.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"prmt"})


@attrs.frozen
class AndOr(Component):
    """(a & mask) | bits as one LOP3, written out (NVRTC 13.0 splits the C expression into two)."""

    template: ClassVar[str] = "ptx/and_or.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"and_or"})


@attrs.frozen
class AndXor(Component):
    """(a & mask) ^ bits as one LOP3."""

    template: ClassVar[str] = "ptx/and_xor.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"and_xor"})


@attrs.frozen
class Fma2(Component):
    """Packed 16-bit fma; the only packed bf16 arithmetic that exists from SM80 on."""

    template: ClassVar[str] = "ptx/fma2.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"fma2"})
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

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return (frozenset({"from_float"} if self.out_dtype in PTX_SCALAR_TYPE else set())
                | frozenset({"to_float"} if self.to_float else set()))

    def extra_context(self) -> dict:
        return {"ptx_scalar": PTX_SCALAR_TYPE[self.dtype], "ptx_out": PTX_SCALAR_TYPE.get(self.out_dtype)}


@attrs.frozen
class GridDependency(Component):
    """griddepcontrol: overlap the prologue with the previous kernel's tail."""

    template: ClassVar[str] = "ptx/grid_dependency.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"wait_for_previous_grid", "allow_next_grid"})
    requires: ClassVar[frozenset[str]] = frozenset({"pdl"})


@attrs.frozen
class GlobalSync(Component):
    """Arrival counter, gpu-scope fences and L2 loads for the split-K hand-off."""

    template: ClassVar[str] = "ptx/global_sync.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"arrive_and_count", "reset_counter", "fence_gpu", "load_cg"})


@attrs.frozen
class GlobalWait(Component):
    """An acquire spin on a global counter (the split-K share reduction waits for a tile's slices)."""

    template: ClassVar[str] = "ptx/global_wait.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"wait_count"})


@attrs.frozen
class Mbarrier(Component):
    """mbarrier init / arrive / expect_tx / parity wait, and (`cp_async`) cp.async completion as an arrival."""

    template: ClassVar[str] = "ptx/mbarrier.cuh.j2"
    family: ClassVar[str] = "ptx"
    requires: ClassVar[frozenset[str]] = frozenset({"tma"})
    cp_async: bool = option_field(True)

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"mbarrier_init", "fence_barrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx",
                          "mbarrier_wait"} | ({"cp_async_arrive_noinc"} if self.cp_async else set()))


@attrs.frozen
class BulkCopy(Component):
    """cp.async.bulk global -> shared, completing on an mbarrier."""

    template: ClassVar[str] = "ptx/bulk_copy.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"bulk_copy"})
    requires: ClassVar[frozenset[str]] = frozenset({"tma"})


@attrs.frozen
class TensorCopy(Component):
    """cp.async.bulk.tensor (TMA through a tensor map) global -> shared, completing on an mbarrier."""

    template: ClassVar[str] = "ptx/tensor_copy.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"tensor_copy_2d", "prefetch_tensor_map"})
    requires: ClassVar[frozenset[str]] = frozenset({"tma"})


@attrs.frozen
class AsyncProxyFence(Component):
    """fence.proxy.async: generic-proxy shared writes become visible to wgmma."""

    template: ClassVar[str] = "ptx/async_proxy_fence.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"fence_async_shared"})
    requires: ClassVar[frozenset[str]] = frozenset({"wgmma"})


@attrs.frozen
class LoadsFence(Component):
    """fence.acq_rel.cta: a consumer's shared loads of a stage are performed before it releases the stage."""

    template: ClassVar[str] = "ptx/loads_fence.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"fence_loads"})


@attrs.frozen
class SetMaxNReg(Component):
    """setmaxnreg: move registers from the producer warpgroup to the consumers."""

    template: ClassVar[str] = "ptx/setmaxnreg.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"registers_decrease", "registers_increase"})
    requires: ClassVar[frozenset[str]] = frozenset({"setmaxnreg"})


@attrs.frozen
class NamedBarrier(Component):
    """bar.sync over the consumer threads only."""

    template: ClassVar[str] = "ptx/named_barrier.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"consumer_sync"})


@attrs.frozen
class EpilogueSync(Component):
    """bar.sync over the warps of k slice 0, which alone run the standard epilogue after reduce_warps_k."""

    template: ClassVar[str] = "ptx/epilogue_sync.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"epilogue_sync"})


@attrs.frozen
class Cluster(Component):
    """Two-CTA clusters sharing weight stages: bulk copy multicast, remote mbarrier arrival, cluster barrier."""

    template: ClassVar[str] = "ptx/cluster.cuh.j2"
    family: ClassVar[str] = "ptx"
    provides: ClassVar[frozenset[str]] = frozenset({"cluster_cta_rank", "bulk_copy_multicast", "peer_shared_address",
                                                   "mbarrier_arrive_remote", "cluster_sync"})
    requires: ClassVar[frozenset[str]] = frozenset({"clusters", "tma_multicast"})


WRAPPERS: dict[str, type[Component]] = {
    "smem_address": SmemAddress, "cp_async": CpAsync, "ldmatrix": Ldmatrix, "stmatrix_x1": Stmatrix,
    "stmatrix_x2": Stmatrix, "prmt": Prmt, "and_or": AndOr, "and_xor": AndXor, "fma2": Fma2,
    "cvt_scalar": CvtScalar, "global_sync": GlobalSync, "global_wait": GlobalWait, "grid_dependency": GridDependency,
    "cp_async_copy": CpAsync, "cp_async_word": CpAsyncWord, "cp_async_drain": CpAsyncDrain, "mbarrier": Mbarrier,
    "mbarrier_tx": Mbarrier, "bulk_copy": BulkCopy,
    "tensor_copy": TensorCopy,
    "async_proxy_fence": AsyncProxyFence, "loads_fence": LoadsFence, "setmaxnreg": SetMaxNReg,
    "named_barrier": NamedBarrier, "cluster": Cluster, "epilogue_sync": EpilogueSync,
}
TYPED = {"fma2"}
# Section order of the wrappers in a source (a wrapper may call one listed before it).
PTX_ORDER = ("smem_address", "cp_async", "cp_async_copy", "cp_async_word", "cp_async_drain", "ldmatrix",
             "stmatrix_x1", "stmatrix_x2", "prmt", "and_or", "and_xor", "fma2", "cvt_scalar", "global_sync", "global_wait", "grid_dependency",
             "mbarrier", "mbarrier_tx", "bulk_copy", "tensor_copy", "cluster", "async_proxy_fence", "loads_fence",
             "setmaxnreg", "named_barrier", "epilogue_sync")


def wrapper(name: str, dtype: str, out_dtype: str, bias: bool, m_tiles: int) -> Component:
    cls = WRAPPERS[name]
    if name == "ldmatrix":
        return cls(x4=m_tiles >= 2, x2=m_tiles % 2 == 1)
    if name in ("stmatrix_x1", "stmatrix_x2"):
        return cls(x1=name == "stmatrix_x1", x2=name == "stmatrix_x2")
    if name == "cp_async_copy":
        return cls(groups=False)
    if name == "mbarrier_tx":  # (transaction arrivals only: no cp.async completes on the barriers)
        return cls(cp_async=False)
    if name == "cvt_scalar":
        return cls(dtype=dtype, out_dtype=out_dtype, to_float=bias)
    return cls(dtype=dtype) if name in TYPED else cls()


def wrappers_for(body: "list[Component]", dtype: str, out_dtype: str, bias: bool, m_tiles: int) -> list[Component]:
    """The wrappers the components of `body` call, in PTX_ORDER: a source holds no wrapper it does not use."""
    used = {p for c in body for p in getattr(c, "ptx", ())}
    if "cp_async" in used:
        used.discard("cp_async_copy")  # the full wrapper holds the copy too
    if "cp_async" in used or "cp_async_copy" in used:
        used.discard("cp_async_drain")  # (so does the copy wrapper without groups)
    if "mbarrier" in used:
        used.discard("mbarrier_tx")  # the full wrapper holds the transaction arrivals too
    unknown = used - set(PTX_ORDER)
    if unknown:
        raise ValueError(f"components call unknown ptx wrappers {sorted(unknown)}; known: {PTX_ORDER}")
    return [wrapper(p, dtype, out_dtype, bias, m_tiles) for p in PTX_ORDER if p in used]
