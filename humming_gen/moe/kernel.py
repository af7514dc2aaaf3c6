"""MoE routing kernels: `AlignConfig` (what to generate) -> components -> source -> compiled kernel.

Three kinds, chosen on the host from numel = M * topk alone (never from data, so no host sync):
- "single": one CTA of 512 threads does it all (numel <= SINGLE_MAX): count per warp, prefix, scan, fill, scatter.
- "count" + "scatter": CTAs of 256 threads own CHUNK assignments each. The count kernel writes per-CTA counts per
  expert (partials); the scatter kernel counts its chunk again, reads the partials to place its warps, and every
  CTA scans the padded offsets itself, so no kernel needs a grid-wide barrier or atomics.

Order within an expert is the assignment order (stable): a warp walks a contiguous slice in order and ranks lanes
of one expert by lane (match.any), warps and CTAs are placed by exclusive prefixes of their counts.
E, block_m and numel are kernel arguments: one compiled kernel serves every layer of a kind.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, ClassVar

import attrs

import humming_gen.runtime as runtime
from humming_gen.codegen import standalone
from humming_gen.components.base import Component
from humming_gen.components.ptx.wrappers import GridDependency
from humming_gen.targets import Target

KINDS = ("single", "count", "scatter")
INDEX_TYPES = {"int32": "int", "int64": "long long"}
THREADS = {"single": 512, "count": 256, "scatter": 256}
SINGLE_MAX = 4096   # numel up to which one CTA aligns everything
CHUNK = 4096        # assignments per CTA of the multi-CTA kernels (16 steps of 32 per warp)
MAX_EXPERTS = 1024  # the single kernel's shared rows: 16 warps x 1024 experts x 4 bytes = 64 KiB + offsets
VERSION = "0.1.0"


@attrs.frozen
class AlignConfig(standalone.StandaloneConfig):
    """One routing kernel: its kind, the dtype of topk_ids, of expert_map (None: no map) and the target."""

    kind: str
    id_dtype: str
    map_dtype: str | None
    target: Target

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"AlignConfig.kind: got {self.kind!r}; allowed: {KINDS}")
        if self.id_dtype not in INDEX_TYPES:
            raise ValueError(f"AlignConfig.id_dtype: got {self.id_dtype!r}; allowed: {tuple(INDEX_TYPES)}")
        if self.map_dtype is not None and self.map_dtype not in INDEX_TYPES:
            raise ValueError(f"AlignConfig.map_dtype: got {self.map_dtype!r}; allowed: None, {tuple(INDEX_TYPES)}")

    @property
    def threads(self) -> int:
        return THREADS[self.kind]

    @property
    def pdl(self) -> bool:
        return self.target.has("pdl")

    def shared_bytes(self, num_experts: int) -> int:
        """Dynamic shared memory: per-warp rows of every expert (+ counts, offsets, warp sums to scan them)."""
        warps = self.threads // 32
        if self.kind == "count":
            return 4 * warps * num_experts
        return 4 * (warps * num_experts + 2 * num_experts + 1 + warps)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "id_dtype": self.id_dtype, "map_dtype": self.map_dtype,
                "target": self.target.name}

    def summary(self) -> str:
        return (f"moe_align kind={self.kind} threads={self.threads} topk_ids={self.id_dtype} "
                f"expert_map={self.map_dtype or 'none'} pdl={'yes' if self.pdl else 'no'}")

    @property
    def kernel_name(self) -> str:
        name = f"moe_align_{self.kind}_{self.id_dtype}_map{self.map_dtype or 'none'}_{self.target.name}"
        return self.named(name)


@attrs.frozen
class WarpPtx(Component):
    """match.any (lanes with the same expert) and %lanemask_lt (lanes below this one)."""

    template: ClassVar[str] = "moe/warp_ptx.cuh.j2"
    family: ClassVar[str] = "ptx"


@attrs.frozen
class ExpertOf(Component):
    """Reads one assignment's expert id and maps it to a local expert, or -1 when the assignment is skipped."""

    template: ClassVar[str] = "moe/expert_of.cuh.j2"
    family: ClassVar[str] = "memory"
    id_type: str
    map_type: str | None


@attrs.frozen
class WarpChunk(Component):
    """A warp's in-order walk of its slice: per-expert counts, and (scatter) stable positions."""

    template: ClassVar[str] = "moe/warp_chunk.cuh.j2"
    family: ClassVar[str] = "schedule"
    scatter: bool


@attrs.frozen
class ExpertScan(Component):
    """CTA-wide exclusive scan of the counts rounded up to block_m: each expert's padded offset."""

    template: ClassVar[str] = "moe/expert_scan.cuh.j2"
    family: ClassVar[str] = "schedule"


@attrs.frozen
class FillOutputs(Component):
    """Padding sentinels, the expert of each block, counts, offsets and the total, shared by the CTAs."""

    template: ClassVar[str] = "moe/fill.cuh.j2"
    family: ClassVar[str] = "epilogue"


@attrs.frozen
class Skeleton(Component):
    """The kernel entry: align_count, or align_scatter (with partials from the count kernel, or one CTA alone)."""

    family: ClassVar[str] = "pipeline"
    kind: str
    kernel_name: str
    pdl: bool

    @property
    def template(self) -> str:  # type: ignore[override]
        return "moe/align_count.cuh.j2" if self.kind == "count" else "moe/align_scatter.cuh.j2"

    def extra_context(self) -> dict[str, Any]:
        return {"partials": self.kind == "scatter"}


def components(cfg: AlignConfig) -> list[Component]:
    """The components of a config's kernel, in section order."""
    scatter = cfg.kind != "count"
    out: list[Component] = [GridDependency()] if cfg.pdl else []
    out += [WarpPtx(), ExpertOf(id_type=INDEX_TYPES[cfg.id_dtype],
                                map_type=INDEX_TYPES[cfg.map_dtype] if cfg.map_dtype else None),
            WarpChunk(scatter=scatter)]
    if scatter:
        out += [ExpertScan(), FillOutputs()]
    out.append(Skeleton(kind=cfg.kind, kernel_name=cfg.kernel_name, pdl=cfg.pdl))
    return out


def constants(cfg: AlignConfig) -> list[tuple[str, int, str]]:
    return [("kThreads", cfg.threads, "threads per CTA"), ("kWarps", cfg.threads // 32, "warps per CTA")]


def param_fields(cfg: AlignConfig) -> list[tuple[str, str, str]]:
    """(name, C type, comment) of the kernel's by-value Params struct, in packing order."""
    fields = [("topk_ids", "const void*", f"(M, topk) {cfg.id_dtype}, row-major")]
    if cfg.map_dtype:
        fields.append(("expert_map", "const void*", f"(num_ids,) {cfg.map_dtype}: global id -> local expert or -1"))
    if cfg.kind == "count":
        fields.append(("partials", "int*", "written: (gridDim.x, num_experts) counts per CTA"))
    else:
        if cfg.kind == "scatter":
            fields.append(("partials", "const int*", "(gridDim.x, num_experts) counts per CTA"))
        fields += [("sorted_ids", "int*", "(max_padded,) assignment indices by expert, padding = numel"),
                   ("expert_ids", "int*", "(max_padded / block_m,) local expert per block, -1 past the total"),
                   ("total", "int*", "(1,) padded total"),
                   ("expert_offsets", "int*", "(num_experts + 1,) padded start of each expert"),
                   ("expert_counts", "int*", "(num_experts,) assignments per expert"),
                   ("inverse", "int*", "(numel,) position of each assignment in sorted_ids, -1 if skipped")]
    fields += [("numel", "int", "M * topk"), ("num_ids", "int", "valid topk_ids are [0, num_ids)"),
               ("num_experts", "int", "local experts"), ("chunk", "int", "assignments per CTA, kWarps slices")]
    if cfg.kind != "count":
        fields += [("block_m", "int", "tile height the experts are padded to"),
                   ("max_padded", "int", "length of sorted_ids, a multiple of block_m")]
    return fields


def params_struct(cfg: AlignConfig) -> struct.Struct:
    """struct.Struct packing Params with C alignment (8-byte fields aligned, tail padded to 8)."""
    return standalone.params_struct(param_fields(cfg))


def generate(cfg: AlignConfig, compiler: str | None = None) -> str:
    """The kernel's complete .cu (deterministic)."""
    return standalone.render_source(cfg, "moe/header.cuh.j2", VERSION, components(cfg), constants(cfg),
                                    param_fields(cfg), compiler)


@functools.lru_cache(maxsize=64)
def build(cfg: AlignConfig, compiler: str | None = None) -> "AlignKernel":
    """Generate and compile (memory and disk cache of humming_gen.runtime); one kernel object per config."""
    source = generate(cfg, compiler)
    return AlignKernel(cfg, source, standalone.compile_source(cfg, source, compiler), param_fields(cfg))


class AlignKernel(standalone.StandaloneKernel):
    """A compiled routing kernel; loaded on first launch (per device and shared-memory size)."""

    def __init__(self, cfg: AlignConfig, source: str, compiled: Any, fields: list[tuple[str, str, str]]):
        super().__init__(cfg, source, compiled, fields)
        self._block = (cfg.threads, 1, 1)
        self._smem: dict[int, int] = {}  # num_experts -> dynamic shared memory

    def launch(self, grid: int, values: dict[str, int], num_experts: int, device: int) -> None:
        """Launch on torch's current stream (PDL where the target has it); `values` fills every Params field."""
        smem = self._smem.get(num_experts)
        if smem is None:
            smem = self._smem[num_experts] = self.config.shared_bytes(num_experts)
        runtime.launch(self.function(device, smem), (grid, 1, 1), self._block, smem, self.pack(values), pdl=self._pdl)
