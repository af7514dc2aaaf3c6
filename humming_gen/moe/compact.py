"""MoE rows into expert order: `CompactConfig` -> components -> source -> compiled kernel, and `compact_rows`, which
runs it.

QuantMoE's grouped down GEMM (down_gemm="grouped_contiguous") reads GEMM1's rows as dense per-expert windows, like
DeepGEMM's contiguous layout, instead of gathering them through the routing and scattering its output: this kernel
copies assignment i's row of GEMM1's output (row i = m * top_k + j) to row c of `dst`, where c is the assignment's
position in moe_align's padded order less the padding before its expert (pos - expert_offsets[e] +
compact_offsets[e], e the expert of pos's block; compact_offsets the exclusive prefix of expert_counts, E + 1
entries: the down GEMM's expert_layout). It writes c to rows[i] (-1 for a skipped assignment, whose row is not read),
which the weighted top-k reduction reads (humming_gen.moe.reduce.weighted_topk_reduce).

One warp per assignment, 16-byte vectors (any 16-bit or 8-bit row whose bytes are a multiple of 16); the row length
and strides are arguments: one kernel per target.
"""

from __future__ import annotations

import contextlib
import functools
import struct
from typing import ClassVar

import attrs
import torch

import humming_gen.runtime as runtime
from humming_gen.codegen import standalone
from humming_gen.components.base import Component
from humming_gen.components.ptx.wrappers import GridDependency
from humming_gen.reference.moe import MoeAlignment
from humming_gen.targets import Target

THREADS = 128  # 4 warps, one assignment each
# Measured and not adopted (H200, 2026-12-02, torch profiler, bench/moe_layer_kernels.py, M = 4096, us): each lane
# loading its first four vectors of the row before the three dependent lookups of its destination: DeepSeek-V3 25.4
# -> 24.4, Qwen3-30B-A3B 37.3 -> 35.9, gpt-oss-120b 65.8 -> 64.9 (the kernel's time includes its PDL wait for GEMM1).
# Nor the copy's removal (2026-12-03, whole W4A16 layer, graph us, M = 4096, both orders in one process): a
# warp-specialized GEMM1 storing its rows straight into the windows (its store given the unit's window as c and m,
# this kernel launched without vectors for `rows`), bit for bit the same windows on the GPU, ran DeepSeek-V3 per rank
# 1198.4 copied / 1200.9 windowed, gpt-oss-120b 2272.6 / 2366.6 (Qwen3-30B-A3B, one order: 834.9 / 814.7).
VERSION = "0.1.0"


@attrs.frozen
class CompactConfig(standalone.StandaloneConfig):
    """One row-compaction kernel: the target (PDL where it has it)."""

    target: Target

    @property
    def pdl(self) -> bool:
        return self.target.has("pdl")

    def to_dict(self) -> dict:
        return {"target": self.target.name}

    def summary(self) -> str:
        return f"moe_compact_rows 16-byte vectors threads={THREADS} pdl={'yes' if self.pdl else 'no'}"

    @property
    def kernel_name(self) -> str:
        return self.named(f"moe_compact_rows_{self.target.name}")


@attrs.frozen
class Skeleton(Component):
    """The kernel entry: one warp per assignment, its compact row and the copy."""

    template: ClassVar[str] = "moe/compact_rows.cuh.j2"
    family: ClassVar[str] = "pipeline"
    kernel_name: str
    pdl: bool


def components(cfg: CompactConfig) -> list[Component]:
    return ([GridDependency()] if cfg.pdl else []) + [Skeleton(kernel_name=cfg.kernel_name, pdl=cfg.pdl)]


def constants(cfg: CompactConfig) -> list[tuple[str, int, str]]:
    return [("kThreads", THREADS, "threads per CTA"), ("kWarps", THREADS // 32, "assignments per CTA")]


def param_fields(cfg: CompactConfig) -> list[tuple[str, str, str]]:
    """(name, C type, comment) of the kernel's by-value Params struct, in packing order."""
    return [("src", "const void*", "(numel, row_bytes) GEMM1's rows, one per assignment, row stride src_stride bytes"),
            ("dst", "void*", "(numel, row_bytes) the rows in expert order, row stride dst_stride bytes"),
            ("rows", "int*", "(numel,) out: the row of dst of each assignment, -1 if skipped"),
            ("inverse", "const int*", "(numel,) moe_align's position of each assignment, -1 if skipped"),
            ("expert_ids", "const int*", "moe_align's expert of each block of block_m positions"),
            ("expert_offsets", "const int*", "(E + 1,) moe_align's padded start of each expert's run"),
            ("compact_offsets", "const int*", "(E + 1,) exclusive prefix of the experts' counts"),
            ("src_stride", "long long", ""), ("dst_stride", "long long", ""),
            ("numel", "int", "assignments (M * top_k)"), ("block_m", "int", "moe_align's block"),
            ("vectors", "int", "16-byte vectors per row")]


def params_struct(cfg: CompactConfig) -> struct.Struct:
    """struct.Struct packing Params with C alignment (8-byte fields aligned, tail padded to 8)."""
    return standalone.params_struct(param_fields(cfg))


def generate(cfg: CompactConfig, compiler: str | None = None) -> str:
    """The kernel's complete .cu (deterministic)."""
    return standalone.render_source(cfg, "moe/compact_rows_header.cuh.j2", VERSION, components(cfg), constants(cfg),
                                    param_fields(cfg), compiler)


@functools.lru_cache(maxsize=8)
def build(cfg: CompactConfig, compiler: str | None = None) -> "CompactKernel":
    """Generate and compile (memory and disk cache of humming_gen.runtime); one kernel object per config."""
    source = generate(cfg, compiler)
    return CompactKernel(cfg, source, standalone.compile_source(cfg, source, compiler), param_fields(cfg))


class CompactKernel(standalone.StandaloneKernel):
    """A compiled row-compaction kernel; loaded on first launch (per device)."""

    def launch(self, numel: int, values: dict[str, int], device: int) -> None:
        grid = (-(-numel // (THREADS // 32)), 1, 1)
        runtime.launch(self.function(device), grid, (THREADS, 1, 1), 0, self.pack(values), pdl=self._pdl)


_kernels: dict[tuple, CompactKernel] = {}
_DEVICE_TYPES = ("cuda",)  # where the kernel runs (CPU tests of the host path add "cpu", with launches stubbed)


def kernel_for(target: Target, compiler: str | None = None) -> CompactKernel:
    """build(CompactConfig(...)) without building and hashing the config on every call."""
    key = (id(target), compiler)
    found = _kernels.get(key)
    if found is None or found.config.target is not target:
        found = _kernels[key] = build(CompactConfig(target), compiler)
    return found


def compact_offsets(expert_counts: torch.Tensor) -> torch.Tensor:
    """(E + 1,) int32: 0, then the running sum of moe_align's expert_counts (the grouped GEMM's expert_layout)."""
    offsets = torch.zeros(expert_counts.numel() + 1, dtype=torch.int32, device=expert_counts.device)
    torch.cumsum(expert_counts, 0, dtype=torch.int32, out=offsets[1:])
    return offsets


def compact_rows_reference(src: torch.Tensor, inverse: torch.Tensor, expert_ids: torch.Tensor,
                           expert_offsets: torch.Tensor, offsets: torch.Tensor, block_m: int,
                           dst: torch.Tensor) -> torch.Tensor:
    """The kernel's result in torch (any device): fills dst's compact rows, returns rows."""
    pos = inverse.long()
    keep = pos >= 0
    expert = expert_ids.long()[pos.clamp(min=0) // block_m]
    rows = torch.where(keep, pos - expert_offsets.long()[expert] + offsets.long()[expert], torch.full_like(pos, -1))
    dst[rows[keep]] = src[keep]
    return rows.to(torch.int32)


def compact_rows(src: torch.Tensor, routing: MoeAlignment, block_m: int, offsets: torch.Tensor, dst: torch.Tensor,
                 target: Target, compiler: str | None = None) -> torch.Tensor:
    """Copy each routed assignment's row of `src` ((M * top_k, K), row i = assignment i) into its expert's window of
    `dst` (rows [offsets[e], offsets[e + 1]) hold expert e's assignments in assignment order), and return `rows`
    ((M * top_k,) int32: the row of dst of each assignment, -1 if skipped). `routing`: the MoeAlignment padded to
    block_m; offsets: compact_offsets(routing.expert_counts). src and dst: same dtype and row length (bytes a
    multiple of 16, 16-byte aligned rows); dst's rows past offsets[E] are not written. No host sync (QuantMoE checks
    the shapes; this is its internal step)."""
    numel = src.shape[0]
    rows = torch.empty(numel, dtype=torch.int32, device=src.device)
    if src.device.type not in _DEVICE_TYPES:
        return compact_rows_reference(src, routing.inverse, routing.expert_ids, routing.expert_offsets, offsets,
                                      block_m, dst)
    row_bytes = src.shape[1] * src.element_size()
    if numel:
        current = torch.cuda.current_device()
        index = src.device.index if src.device.index is not None else current
        values = {"src": src.data_ptr(), "dst": dst.data_ptr(), "rows": rows.data_ptr(),
                  "inverse": routing.inverse.data_ptr(), "expert_ids": routing.expert_ids.data_ptr(),
                  "expert_offsets": routing.expert_offsets.data_ptr(), "compact_offsets": offsets.data_ptr(),
                  "src_stride": src.stride(0) * src.element_size(), "dst_stride": dst.stride(0) * dst.element_size(),
                  "numel": numel, "block_m": block_m, "vectors": row_bytes // 16}
        with torch.cuda.device(index) if index != current else contextlib.nullcontext():
            kernel_for(target, compiler).launch(numel, values, index)
    return rows

