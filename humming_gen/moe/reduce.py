"""The MoE top-k reduction: `ReduceConfig` (what to generate) -> components -> source -> compiled kernel, and
`topk_reduce`, which runs it.

GEMM2 of QuantMoE writes one row per assignment (i = m * top_k + j, the router weight applied); this kernel sums a
token's top_k rows in fp32 and writes the token's output row in the layer's dtype. Deterministic: no atomics, each
output element is summed by one thread in a fixed order, the order of the torch path it replaces (torch.sum over the
slots in fp32 on CUDA, then the cast; humming_gen.reference.moe.topk_sum_reference spells it out), so the bits are
those of that path. Slots whose assignment moe_align skipped (its `inverse` entry is -1: a -1 id, an id outside the
range, an expert that expert_map sends to -1) are left out and their rows never read, so GEMM2's output needs no
zero fill.

The weighted variant (`weighted_topk_reduce`) serves a GEMM2 that writes unweighted rows in some other order (the
grouped down GEMM of QuantMoE(down_gemm="grouped_contiguous"), on rows in expert order: humming_gen.moe.compact):
slot j of token m reads row rows[m * top_k + j] of y (-1: skipped, not read) and adds weights[m * top_k + j] times it
(an fp32 product, rounded, then the add: never an fma), in the same order.

One CTA per (token, chunk of the row): blockIdx.x the token, blockIdx.y the chunk of kThreads 16-byte vectors (8
columns each), one vector per thread. top_k, H and the strides are kernel arguments: one kernel per (dtype, target,
weighted).
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
from humming_gen.components.ptx.wrappers import CvtScalar, GridDependency
from humming_gen.reference.moe import TOPK_SUM_ACCUMULATORS, topk_sum_reference, weighted_topk_sum_reference
from humming_gen.targets import Target

DTYPES = ("bfloat16", "float16")
THREADS = 128   # threads (16-byte vectors of a row) per CTA
VECTOR = 8      # 16-bit elements per 16-byte vector
# Slots whose vectors a thread loads before their adds (a multiple of the accumulators: slot j stays in j % 4). H200,
# M = 4096, torch profiler (bench/moe_layer_kernels.py), us, one slot at a time -> 8 held, plain / weighted: DeepSeek-V3
# (top-8, H = 7168) 177.2 / 167.5 -> 160.5 / 162.2, Qwen3-30B-A3B (top-8) 56.5 / 53.9 -> 52.1 / 51.2, gpt-oss-120b
# (top-4) 47.7 / 43.1 -> 47.9 / 44.3 (96 / 80 registers, no spills; the bits are unchanged).
HELD_SLOTS = 2 * TOPK_SUM_ACCUMULATORS
VERSION = "0.1.0"
_TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


@attrs.frozen
class ReduceConfig(standalone.StandaloneConfig):
    """One top-k reduction kernel: the dtype of GEMM2's rows and of the output (the layer's), and the target."""

    dtype: str
    target: Target
    weighted: bool = False  # rows through an index and times the router weight (weighted_topk_reduce)

    def __attrs_post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"ReduceConfig.dtype: got {self.dtype!r}; allowed: {DTYPES}")
        if self.dtype == "bfloat16":
            self.target.require("mma_bf16", "the top-k reduction's bfloat16 conversions (cvt.rn.bf16.f32)")

    @property
    def pdl(self) -> bool:
        return self.target.has("pdl")

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "target": self.target.name} | ({"weighted": True} if self.weighted else {})

    def summary(self) -> str:
        return (f"moe_topk_reduce {self.dtype} -> fp32 {'weighted ' if self.weighted else ''}sum -> {self.dtype} "
                f"threads={THREADS} accumulators={TOPK_SUM_ACCUMULATORS} pdl={'yes' if self.pdl else 'no'}")

    @property
    def kernel_name(self) -> str:
        name = f"moe_topk_reduce_{'weighted_' if self.weighted else ''}{self.dtype}_{self.target.name}"
        return self.named(name)


@attrs.frozen
class RowVectors(Component):
    """16-byte vectors of a 16-bit row: load into fp32, add (add.rn.f32, never contracted or flushed), store."""

    template: ClassVar[str] = "moe/topk_reduce_vectors.cuh.j2"
    family: ClassVar[str] = "memory"
    dtype: str
    weighted: bool = False  # also the weighted add (mul.rn.f32, then add.rn.f32)


@attrs.frozen
class Skeleton(Component):
    """The kernel entry: a token's top_k rows summed over one chunk of columns."""

    template: ClassVar[str] = "moe/topk_reduce.cuh.j2"
    family: ClassVar[str] = "pipeline"
    kernel_name: str
    pdl: bool
    weighted: bool = False


def components(cfg: ReduceConfig) -> list[Component]:
    """The components of a config's kernel, in section order."""
    out: list[Component] = [GridDependency()] if cfg.pdl else []
    out += [CvtScalar(dtype=cfg.dtype, out_dtype=cfg.dtype, to_float=True),
            RowVectors(dtype=cfg.dtype, weighted=cfg.weighted),
            Skeleton(kernel_name=cfg.kernel_name, pdl=cfg.pdl, weighted=cfg.weighted)]
    return out


def constants(cfg: ReduceConfig) -> list[tuple[str, int, str]]:
    return [("kThreads", THREADS, "threads per CTA, one 16-byte vector each"),
            ("kVector", VECTOR, "elements per vector"),
            ("kAccumulators", TOPK_SUM_ACCUMULATORS, "slot j adds into accumulator j % kAccumulators (torch.sum's)"),
            ("kHeldSlots", HELD_SLOTS, "slots whose vectors are loaded before their adds")]


def param_fields(cfg: ReduceConfig) -> list[tuple[str, str, str]]:
    """(name, C type, comment) of the kernel's by-value Params struct, in packing order."""
    if cfg.weighted:
        slots = [("y", "const void*", f"(rows, n) {cfg.dtype} unweighted rows, row stride ldy elements"),
                 ("rows", "const int*", "(m * top_k,) the row of y of each assignment, -1 if skipped"),
                 ("weights", "const float*", "(m * top_k,) the router weight of each assignment")]
    else:
        slots = [("y", "const void*", f"(m * top_k, n) {cfg.dtype} assignment rows, row stride ldy elements"),
                 ("inverse", "const int*", "(m * top_k,) moe_align's position of each assignment, -1 if skipped")]
    return slots + [("out", "void*", f"(m, n) {cfg.dtype}, row stride ldo elements"),
                    ("ldy", "long long", ""), ("ldo", "long long", ""),
                    ("top_k", "int", "assignments per token"), ("vectors", "int", "n / kVector")]


def params_struct(cfg: ReduceConfig) -> struct.Struct:
    """struct.Struct packing Params with C alignment (8-byte fields aligned, tail padded to 8)."""
    return standalone.params_struct(param_fields(cfg))


def generate(cfg: ReduceConfig, compiler: str | None = None) -> str:
    """The kernel's complete .cu (deterministic)."""
    return standalone.render_source(cfg, "moe/topk_reduce_header.cuh.j2", VERSION, components(cfg), constants(cfg),
                                    param_fields(cfg), compiler)


@functools.lru_cache(maxsize=16)
def build(cfg: ReduceConfig, compiler: str | None = None) -> "ReduceKernel":
    """Generate and compile (memory and disk cache of humming_gen.runtime); one kernel object per config."""
    source = generate(cfg, compiler)
    return ReduceKernel(cfg, source, standalone.compile_source(cfg, source, compiler), param_fields(cfg))


class ReduceKernel(standalone.StandaloneKernel):
    """A compiled top-k reduction kernel; loaded on first launch (per device)."""

    def launch(self, m: int, values: dict[str, int], device: int) -> None:
        """Launch on torch's current stream (PDL where the target has it); `values` fills every Params field."""
        vectors = values["vectors"]
        threads = min(THREADS, -(-vectors // 32) * 32)  # short rows: no idle warps
        grid = (m, -(-vectors // threads), 1)
        runtime.launch(self.function(device), grid, (threads, 1, 1), 0, self.pack(values), pdl=self._pdl)


_kernels: dict[tuple, ReduceKernel] = {}
_targets: dict[int, Target] = {}
_DEVICE_TYPES = ("cuda",)  # where the kernel runs (CPU tests of the host path add "cpu", with launches stubbed)


def _target(index: int) -> Target:
    found = _targets.get(index)
    if found is None:
        found = _targets[index] = Target.current(index)
    return found


def kernel_for(dtype: str, target: Target, compiler: str | None = None, weighted: bool = False) -> ReduceKernel:
    """build(ReduceConfig(...)) without building and hashing the config on every call."""
    key = (dtype, id(target), compiler, weighted)
    found = _kernels.get(key)
    if found is None or found.config.target is not target:
        found = _kernels[key] = build(ReduceConfig(dtype, target, weighted), compiler)
    return found


def topk_reduce(y: torch.Tensor, inverse: torch.Tensor, top_k: int, out: torch.Tensor | None = None,
                target: Target | None = None, compiler: str | None = None) -> torch.Tensor:
    """(M, H): token m's rows y[m * top_k + j] summed over its slots j in fp32, in torch.sum's CUDA order
    (humming_gen.reference.moe.topk_sum_reference), slots with inverse[m * top_k + j] < 0 left out (their rows
    are not read), rounded to y's dtype; written into `out` when given ((M, H), y's dtype and device).

    y: (M * top_k, H) bfloat16 / float16 with unit column stride, H a multiple of 8; inverse: (M * top_k,)
    contiguous int32 on y's device (MoeAlignment.inverse). On CUDA the generated kernel runs on torch's current
    stream without a host sync (an `out` whose rows are not 16-byte aligned goes through a temporary); on the CPU
    the torch reference gives the same bits. target / compiler: of the kernel (default: the device's target).
    Raises ValueError naming the argument."""
    name = "topk_reduce"
    _check_rows(name, y)
    rows = y.shape[0]
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0 or (rows % top_k if top_k else rows):
        raise ValueError(f"{name}: top_k = {top_k!r} must be an int >= 0 dividing y's {rows} rows")
    _check_index(name, "inverse", inverse, rows, y.device)
    return _reduce(name, y, {"inverse": inverse}, rows // top_k if top_k else 0, top_k, out, target, compiler,
                   lambda: topk_sum_reference(y, inverse, top_k, y.dtype))


def weighted_topk_reduce(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, top_k: int,
                         out: torch.Tensor | None = None, target: Target | None = None,
                         compiler: str | None = None) -> torch.Tensor:
    """(M, H): token m's slots j summed in fp32, each weights[i] * y[rows[i]] (i = m * top_k + j; the fp32 product
    rounded, then added in torch.sum's CUDA order: humming_gen.reference.moe.weighted_topk_sum_reference), slots with
    rows[i] < 0 left out (no row read), rounded to y's dtype; written into `out` when given.

    y: (R, H) bfloat16 / float16 rows in any order (unit column stride, H a multiple of 8); rows: (M * top_k,)
    contiguous int32 on y's device, each in [-1, R) (unchecked: on the GPU that would be a host sync);
    weights: (M * top_k,) contiguous float32 on y's device. As topk_reduce otherwise."""
    name = "weighted_topk_reduce"
    _check_rows(name, y)
    if not isinstance(rows, torch.Tensor) or not isinstance(weights, torch.Tensor):
        raise TypeError(f"{name}: rows and weights must be torch.Tensors, got {type(rows).__name__} and "
                        f"{type(weights).__name__}")
    numel = rows.numel()
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0 or (numel % top_k if top_k else numel):
        raise ValueError(f"{name}: top_k = {top_k!r} must be an int >= 0 dividing the {numel} entries of rows")
    _check_index(name, "rows", rows, numel, y.device)
    if weights.dtype != torch.float32 or weights.numel() != numel or not weights.is_contiguous() \
            or weights.device != y.device:
        raise ValueError(f"{name}: weights must be a contiguous float32 tensor of {numel} entries on {y.device}, got "
                         f"{weights.dtype} {tuple(weights.shape)} on {weights.device}")
    return _reduce(name, y, {"rows": rows, "weights": weights}, numel // top_k if top_k else 0, top_k, out, target,
                   compiler, lambda: weighted_topk_sum_reference(y, rows, weights, top_k, y.dtype))


def _check_rows(name: str, y: torch.Tensor) -> None:
    if not isinstance(y, torch.Tensor) or y.dim() != 2 or y.dtype not in _TORCH_DTYPES or y.stride(1) != 1:
        raise ValueError(f"{name}: y must be a 2-D bfloat16 / float16 tensor of unit column stride, got "
                         f"{getattr(y, 'dtype', type(y).__name__)} {tuple(getattr(y, 'shape', ()))} strides "
                         f"{y.stride() if isinstance(y, torch.Tensor) else ()}")


def _check_index(name: str, arg: str, t: torch.Tensor, numel: int, device: torch.device) -> None:
    if t.dtype != torch.int32 or t.numel() != numel or not t.is_contiguous() or t.device != device:
        raise ValueError(f"{name}: {arg} must be a contiguous int32 tensor of {numel} entries on {device}, got "
                         f"{t.dtype} {tuple(t.shape)} on {t.device}")


def _reduce(name: str, y: torch.Tensor, slots: dict[str, torch.Tensor], m: int, top_k: int,
            out: torch.Tensor | None, target: Target | None, compiler: str | None, reference) -> torch.Tensor:
    """The launch both reductions share: `slots` the kernel's per-assignment tensors (by Params field name)."""
    hidden = y.shape[1]
    if out is not None and (tuple(out.shape) != (m, hidden) or out.dtype != y.dtype or out.device != y.device):
        raise ValueError(f"{name}: out must be ({m}, {hidden}) {y.dtype} on {y.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if y.device.type not in _DEVICE_TYPES:
        total = reference()
        return total if out is None else out.copy_(total)
    if hidden % VECTOR:
        raise ValueError(f"{name}: H = {hidden} must be a multiple of {VECTOR} (16-byte vectors)")
    # the kernel reads and writes rows in 16-byte pieces; anything else goes through a temporary or a copy
    direct = out is not None and out.stride(1) == 1 and out.stride(0) % VECTOR == 0 and out.data_ptr() % 16 == 0
    result = out if direct else torch.empty(m, hidden, dtype=y.dtype, device=y.device)
    if m and hidden:
        if y.stride(0) % VECTOR or y.data_ptr() % 16:
            # a fresh allocation (16-byte aligned): contiguous() returns a misaligned contiguous view unchanged
            y = torch.empty(y.shape, dtype=y.dtype, device=y.device).copy_(y)
        current = torch.cuda.current_device()
        index = y.device.index if y.device.index is not None else current
        kernel = kernel_for(_TORCH_DTYPES[y.dtype], target if target is not None else _target(index), compiler,
                            weighted="weights" in slots)
        values = {"y": y.data_ptr(), "out": result.data_ptr(), "ldy": y.stride(0), "ldo": result.stride(0),
                  "top_k": top_k, "vectors": hidden // VECTOR} | {k: t.data_ptr() for k, t in slots.items()}
        # NOTE: the device switch only where needed: entering torch.cuda.device costs about as much as a launch
        with torch.cuda.device(index) if index != current else contextlib.nullcontext():
            kernel.launch(m, values, index)
    if out is not None and not direct:
        return out.copy_(result)
    return result
