"""What every pipeline shares: the protocol a pipeline package implements, the KernelPlan it composes, the typed
kernel-argument spec the runtime binds, and the weight layout a prepared weight is packed for.

A pipeline is a package under `humming_gen.pipelines` (standard, warp_specialized, ...) exposing one object that
satisfies `Pipeline`; `humming_gen.pipelines.registry` maps names (TuningConfig.pipeline) to those objects.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from humming_gen.components.base import Component
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.schemes.packing import BLayout
from humming_gen.targets import Target

if TYPE_CHECKING:
    import torch

    from humming_gen.layer.weights import PreparedWeight
    from humming_gen.schemes import QuantizedWeight

SECTION_ORDER = ("ptx", "numeric", "memory", "mma", "schedule", "epilogue", "pipeline")


class ComposeError(ValueError):
    """The configs cannot be served by the chosen pipeline on this target; the message lists every reason."""


def compose_error(reasons: list[str]) -> ComposeError:
    return ComposeError("cannot generate this kernel:\n  - " + "\n  - ".join(dict.fromkeys(reasons)))


# --- kernel arguments ---------------------------------------------------------------------------------------
# Where the runtime takes an argument's value from. Bound once per (kernel, weight) except PER_CALL kinds.
WEIGHT = "weight"        # a tensor of the PreparedWeight (`tensor` names the attribute)
BIAS = "bias"            # the layer's bias
SCRATCH = "scratch"      # a buffer the launcher owns, sized by KernelPlan.scratch(m) (`tensor` names it)
ACTIVATION = "activation"  # per call: the activation matrix (rows of stride lda)
OUTPUT = "output"        # per call: the output matrix (rows of stride ldc)
ROWS = "rows"            # per call: m
LDA = "lda"              # per call: row stride of the activation, elements
LDC = "ldc"              # per call: row stride of the output, elements
ACTIVATION_SCALE = "activation_scale"  # per call: fp32 scales of quantized activations (per token, group or tensor)
ROUTING = "routing"      # per call, MoE: a routing tensor (`tensor`: a MoeAlignment field, topk_weights, expert_layout)
TOP_K = "top_k"          # per call, MoE: assignments per activation row (a row of a is read for `top_k` of them)
OUT_TOP_K = "out_top_k"  # per call, MoE atomic top-k reduction: assignments per output row (row i / out_top_k)
OUTPUT_SCALE = "output_scale"  # per call: scales of an output quantized in the epilogue (or its static scale)
ACTIVATION_MAP = "activation_map"  # per call: the TMA tensor map of the activation (runtime.tensor_map), first field
ARG_KINDS = (WEIGHT, BIAS, SCRATCH, ACTIVATION, OUTPUT, ROWS, LDA, LDC, ACTIVATION_SCALE, ROUTING, TOP_K, OUT_TOP_K,
             OUTPUT_SCALE, ACTIVATION_MAP)
# struct formats of the Params field types; a TensorMap (128 bytes, 64-byte aligned) is the first field where present
CTYPES = {"const void*": "Q", "void*": "Q", "int": "i", "TensorMap": "128s"}


@attrs.frozen
class KernelArg:
    """One field of the kernel's by-value `Params` struct, with where its value comes from."""

    name: str
    ctype: str
    kind: str
    comment: str = ""
    tensor: str | None = None  # WEIGHT: PreparedWeight attribute; SCRATCH: the scratch buffer's name; ROUTING: which

    def __attrs_post_init__(self) -> None:
        if self.kind not in ARG_KINDS:
            raise ValueError(f"KernelArg {self.name}: kind {self.kind!r} is not one of {ARG_KINDS}")
        if self.ctype not in CTYPES:
            raise ValueError(f"KernelArg {self.name}: ctype {self.ctype!r} is not one of {tuple(CTYPES)}")
        if (self.kind in (WEIGHT, SCRATCH, ROUTING)) != (self.tensor is not None):
            raise ValueError(f"KernelArg {self.name}: `tensor` names the weight, scratch or routing tensor of those "
                             f"kinds only")


@attrs.frozen
class Scratch:
    """A buffer the launcher allocates for the kernel: `numel` elements of `dtype`, zeroed once when `zeroed`
    (the kernel leaves it zero again, e.g. split-K arrival counters)."""

    numel: int
    dtype: str  # "float32" | "int32"
    zeroed: bool


# --- weight layout ------------------------------------------------------------------------------------------
@attrs.frozen
class GroupPlan:
    """How per-group parameters reach the kernel: group size along K in the kernel layout, rows per k tile.

    `arbitrary`: the group size is not a multiple of the mma k step (16), so groups do not line up with k tiles.
    Each stage then loads the group rows its k range touches, starting at row k0 // group_size, and every A
    fragment register finds its own row from its k (templates/memory/group_params_cp_async.cuh.j2).
    """

    group_size: int          # elements of K per kernel group row
    rows: int                # kernel group rows (K_pad / group_size, rounded up)
    rows_per_stage: int      # rows a stage loads
    tensors: tuple[str, ...]  # "b_scale", "b_zero"
    arbitrary: bool = False  # group_size is not a multiple of 16 (see above)


@attrs.frozen
class WeightLayout:
    """Everything `prepare_weight` needs to pack a QuantizedWeight for a kernel; kernels with equal layouts share
    one prepared weight (a layer's kernels for all M buckets, of either pipeline, read one copy)."""

    b_layout: BLayout
    n_pad: int
    k_pad: int
    group_size: int | None   # kernel group size along K (GroupPlan.group_size), None without group parameters
    group_rows: int | None
    out_scale: bool          # channel / tensor / global scales folded into a per-column fp32 vector
    code_offset: int         # XOR applied to stored codes (signed -> offset binary)
    converter_bias: float    # what the converter adds (magic number), for zero-point packing
    zero_point: str | None   # None | "int" | "float"
    dtype: str               # compute type of scales and zero terms
    # e8m0 group scales also split into b_exponent and a row factor in out_scale (components.numeric.exponent_fold)
    fold_scales: bool = False
    # the group scales carry 2^scale_exponent for the float converter (pipelines.common.scale_exponent), each row's
    # range factor in out_scale
    scale_exponent: int = 0


# --- the plan -----------------------------------------------------------------------------------------------
@attrs.frozen
class KernelPlan:
    """One composed kernel: its components in section order, `cfg::` constants, argument spec, launch facts and
    the weight layout it reads. `launch` (pipeline-specific) maps a row count to grid and scratch sizes."""

    layer: LayerConfig
    compute: ComputeConfig
    tuning: TuningConfig
    target: Target
    pipeline: str
    kernel_name: str
    components: tuple[Component, ...]
    constants: tuple[tuple[str, int, str], ...]
    args: tuple[KernelArg, ...]
    layout: WeightLayout
    group: GroupPlan | None
    shared_bytes: int
    threads: int
    pdl: bool
    launch: Any  # a LaunchShape of the pipeline: grid(m), scratch(m), cluster

    @property
    def param_fields(self) -> tuple[tuple[str, str, str], ...]:
        """(name, C type, comment) per Params field, for the source's struct."""
        return tuple((a.name, a.ctype, a.comment) for a in self.args)

    def grid(self, m: int) -> tuple[int, int, int]:
        return self.launch.grid(m)

    def scratch(self, m: int) -> dict[str, Scratch]:
        return self.launch.scratch(m)


def split_k_scratch(launch: "TiledLaunch | PersistentLaunch", m: int) -> dict[str, Scratch]:
    """The split-K hand-off's buffers at m rows: fp32 partial tiles of every slice, one arrival counter per tile.
    An indexed MoE kernel's tiles are those of its grid: every m block of the worst-case routing of m assignments
    (m_blocks), since which of them the routing fills is known on the device only."""
    if launch.split_k == 1:
        return {}
    tiles = launch.n_tiles * m_blocks(m, launch.block_m, launch.experts, launch.moe_gemm)
    return {"workspace": Scratch(tiles * launch.split_k * launch.block_m * launch.block_n, "float32", False),
            "counters": Scratch(tiles, "int32", True)}


def m_blocks(m: int, block_m: int, experts: int = 1, moe_gemm: str = "") -> int:
    """m blocks of `block_m` rows covering m rows, or for an MoE gemm type the worst-case routing or segments."""
    bm = block_m
    if moe_gemm == "indexed":  # reference.moe.max_padded_size
        return max(1, math.ceil((m + min(experts, m) * (bm - 1)) / bm))
    if moe_gemm == "grouped_masked":
        return max(1, experts * math.ceil(m // experts / bm))
    if moe_gemm == "grouped_contiguous":  # each segment adds at most one partial block
        return max(1, math.ceil(m / bm) + min(experts, m))
    return max(1, math.ceil(m / bm))


@attrs.frozen
class TiledLaunch:
    """One CTA per (n tile, m tile, k slice); split-K slices hand off through a workspace (standard pipeline)."""

    n_tiles: int
    block_m: int
    block_n: int
    split_k: int
    experts: int = 1
    # MoE: "indexed" (m counts assignments, padded per expert to block_m rows by moe_align), "grouped_masked" (m =
    # experts x max_m rows), "grouped_contiguous" (m rows in per-expert segments); "" for a dense layer
    moe_gemm: str = ""

    @property
    def cluster(self) -> None:
        return None

    def m_blocks(self, m: int) -> int:
        """m blocks of the grid: enough for the worst-case routing or segments."""
        return m_blocks(m, self.block_m, self.experts, self.moe_gemm)

    def grid(self, m: int) -> tuple[int, int, int]:
        return (self.n_tiles, self.m_blocks(m), self.split_k)

    def scratch(self, m: int) -> dict[str, Scratch]:
        return split_k_scratch(self, m)


@attrs.frozen
class PersistentLaunch:
    """A persistent grid: at most `slots` CTAs walk the (tile, k slice) units of the problem (warp-specialized)."""

    n_tiles: int
    block_m: int
    block_n: int
    split_k: int
    slots: int  # CTAs that fit the device at once (SMs x CTAs per SM)
    experts: int = 1
    moe_gemm: str = ""  # "indexed": m counts assignments, the units cover the worst-case routing (TiledLaunch)
    cluster_m: int = 1  # 2: CTA pairs (clusters) take unit pairs, one n tile of two m tiles (an odd last one idle)
    cluster_n: int = 1  # 2: CTA pairs take unit pairs, one m tile of two n tiles (n_tiles even)

    @property
    def cluster(self) -> tuple[int, int, int] | None:
        size = self.cluster_m * self.cluster_n  # (consecutive CTAs of the 1-D persistent grid)
        return (size, 1, 1) if size > 1 else None

    def units(self, m: int) -> int:
        blocks = m_blocks(m, self.block_m, self.experts, self.moe_gemm)
        blocks = -(-blocks // self.cluster_m) * self.cluster_m
        return self.n_tiles * blocks * self.split_k

    def grid(self, m: int) -> tuple[int, int, int]:
        size = self.cluster_m * self.cluster_n
        return (min(self.units(m), self.slots - self.slots % size), 1, 1)

    def scratch(self, m: int) -> dict[str, Scratch]:
        return split_k_scratch(self, m)


@attrs.frozen
class TuningPlan:
    """Contiguous M buckets covering 1..inf, one TuningConfig each. An MoE layer's buckets count rows per expert,
    whose first bound may be a Fraction (heuristics.choose.moe_standard_plans: the split-K bucket below one row)."""

    buckets: tuple[tuple[int | Fraction | None, TuningConfig], ...]

    def for_m(self, m: int) -> TuningConfig:
        for m_max, tuning in self.buckets:
            if m_max is None or m <= m_max:
                return tuning
        raise AssertionError("the last bucket is open-ended")

    def tunings(self) -> list[TuningConfig]:
        return list(dict.fromkeys(t for _, t in self.buckets))


# --- the protocol -------------------------------------------------------------------------------------------
class Pipeline(Protocol):
    """A kernel skeleton family with its own loaders, shared-memory plan, heuristics and weight layout."""

    name: str

    def supports(self, layer: LayerConfig, compute: ComputeConfig, target: Target) -> list[str]:
        """Why this pipeline cannot serve the layer on the target (empty: it can, for some tuning)."""

    def compose(self, layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target) -> KernelPlan:
        """The components of one kernel; ComposeError naming every reason it cannot be built."""

    def shared_memory(self, layer: LayerConfig, tuning: TuningConfig) -> Any:
        """The shared-memory plan (with `.total` bytes) compose and the heuristics both use."""

    def choose_tunings(self, layer: LayerConfig, target: Target) -> TuningPlan:
        """One tuning per M bucket, from this pipeline's measured heuristics."""

    def prepare_weight(self, plan: KernelPlan, qweight: "QuantizedWeight", device: "torch.device | str"
                       ) -> "PreparedWeight":
        """Pad and repack a QuantizedWeight into the layout `plan` reads."""
