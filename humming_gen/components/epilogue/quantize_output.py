"""MoE GEMM1's gated activation quantized for GEMM2 in the epilogue (ComputeConfig.epilogue_quantization).

The store writes act(gate, up) as codes and scales in exactly the layout `humming_gen.quantize_activation` gives
GEMM2 (codes: rows of bytes, stride ldc; scales: (rows, groups) row-major, or one per row), instead of 16-bit rows
that a second kernel quantizes. The values are rounded to the layer dtype first, as the 16-bit store writes them,
and staged in shared memory as the tile's token rows; the epilogue's threads then quantize them with the
activation kernels' own components (humming_gen.activation.components: rounding, scale rule, element codes, vector
loads and stores), rendered in a namespace `act_quant`, so the codes are those of quantize_activation on the rows
the 16-bit store would have written, bit for bit. One CTA must hold every element of each scale: a group scale
whose group divides the tile's features, a per-token scale where the tile covers the whole row, or a static
per-tensor scale (`output_quantization_reasons`).
"""

from __future__ import annotations

import functools
import re
from typing import ClassVar

import attrs

from humming_gen.components.base import Component
from humming_gen.components.epilogue.output import StoreOutput
from humming_gen.schemes.scheme import ActivationScheme

STAGE_PAD = 8  # 16-bit elements after each staged row: 16 bytes keep the fragment writes free of bank conflicts
# the act_quant functions the epilogue calls
ACT_QUANT_CALLS = frozenset({"Vector", "load_vector", "amax_bits", "warp_max_xor", "bits_f32", "BlockScale",
                             "block_scale", "quantize_vector", "store_codes"})


def output_quantization_reasons(scheme: ActivationScheme, static: bool, n: int, block_n: int) -> list[str]:
    """Why the epilogue of a gated MoE GEMM1 of n (gate and up) rows, tiled block_n rows per CTA, cannot quantize
    its n / 2 output features with `scheme` (empty: it can). `static`: a per-tensor scale given (input_scale)."""
    from humming_gen.activation.kernel import scheme_problems

    reasons = list(scheme_problems(scheme))
    features, tile = n // 2, block_n // 2
    if scheme.dtype.bits != 8:
        reasons.append(f"{scheme.dtype.name} activations: the fused epilogue stores 8-bit codes")
    if scheme.global_scale:
        reasons.append("a global scale (NVFP4) needs the amax of every row first")
    if scheme.granularity == "tensor" and not static:
        reasons.append("a dynamic per-tensor scale needs the amax of every row of the batch, which no CTA holds "
                       "(give a static input_scale to fuse)")
    elif scheme.granularity == "group":
        g = scheme.group_size
        if tile % g or features % g:
            reasons.append(f"a scale group of {g} features does not divide the {tile} features of a "
                           f"{block_n}-row gate/up tile (and the {features} of a row): one CTA must hold each group")
        elif g % 8 or g // 8 > 32 or (g // 8) & (g // 8 - 1):
            reasons.append(f"group_size={g}: the fused epilogue reduces a group over a power of two of at most 32 "
                           f"vectors of 8 features")
    elif scheme.granularity == "token":
        padded = -(-n // block_n) * block_n
        if padded > block_n:
            reasons.append(f"a per-token scale needs the amax of the whole row of {features} features, spread over "
                           f"{padded // block_n} CTAs of {tile} features")
        elif tile % 8 or (tile // 8) & (tile // 8 - 1) or tile // 8 > 32:
            reasons.append(f"a per-token scale over a tile of {tile} features: the fused epilogue reduces a row over "
                           f"a power of two of at most 32 vectors of 8 features")
    return reasons


def staged_tile_bytes(block_m: int, block_n: int) -> int:
    """Shared memory of the staged tile: block_m token rows of block_n / 2 16-bit features, padded."""
    return block_m * (block_n // 2 + STAGE_PAD) * 2


def output_args(args: tuple, compute) -> tuple:
    """A kernel's Params with the quantized output: `c` holds codes, `c_scale` (after it) their scales or the static
    per-tensor scale."""
    from humming_gen.pipelines.base import OUTPUT_SCALE, KernelArg

    q = compute.epilogue_quantization
    out = []
    for a in args:
        if a.name == "c":
            out.append(KernelArg("c", "void*", a.kind, f"GEMM2's activation codes (m, n / 2) {q.dtype.name}, row "
                                 f"stride ldc bytes"))
            shape = {"group": "[m][n / 2 / group]", "token": "[m]", "tensor": "[1]"}[q.granularity]
            text = ("the static per-tensor fp32 scale (read)" if compute.epilogue_static_scale
                    else f"{q.scale_dtype.name} scales {shape} (written)")
            out.append(KernelArg("c_scale", "void*", OUTPUT_SCALE, text))
        else:
            out.append(a)
    return tuple(out)


def act_quant_components(scheme: ActivationScheme, static: bool, dtype: str, target_name: str) -> list[Component]:
    """The activation-quantization kernel's components this epilogue renders: every one but the kernel entry,
    the CTA-wide max and the grid-dependency wrappers (the GEMM has its own)."""
    from humming_gen.activation.components import BlockMax, Skeleton
    from humming_gen.activation.kernel import QuantizeConfig, components
    from humming_gen.components.ptx.wrappers import GridDependency
    from humming_gen.targets import get_target

    cfg = QuantizeConfig(scheme, dtype, get_target(target_name), static=static, wide=True)
    return [c for c in components(cfg) if not isinstance(c, (Skeleton, BlockMax, GridDependency))]


_FUNCTION = re.compile(r"__device__\s+__forceinline__\s+[\w:<>,&\s*]*?\b(\w+)\s*\(")
_TYPE = re.compile(r"^struct\s+(?:__align__\(\d+\)\s+)?(\w+)", re.M)


@functools.lru_cache(maxsize=64)
def _act_quant_source(scheme: ActivationScheme, static: bool, dtype: str, target: str
                      ) -> tuple[str, tuple[tuple[str, int, str], ...], frozenset[str]]:
    """(rendered components, the act_quant::cfg constants they read, the functions and types they define)."""
    from humming_gen.activation.kernel import QuantizeConfig, constants
    from humming_gen.codegen.render import environment
    from humming_gen.targets import get_target

    env = environment()
    text = "".join(f"\n// ---- act_quant: {c.describe()}\n" + env.get_template(c.template).render(**c.context())
                   for c in act_quant_components(scheme, static, dtype, target))
    cfg = QuantizeConfig(scheme, dtype, get_target(target), static=static, wide=True)
    used = tuple(c for c in constants(cfg) if re.search(rf"cfg::{c[0]}\b", text))
    code = re.sub(r"//[^\n]*", "", text)
    return text, used, frozenset(_FUNCTION.findall(code)) | frozenset(_TYPE.findall(code))


@attrs.frozen
class ActQuantCode(Component):
    """The activation kernels' rounding, scale rule, element codes and vector loads / stores, in namespace
    act_quant (some names, e.g. to_float, are the GEMM's too), with their act_quant::cfg constants."""

    template: ClassVar[str] = "epilogue/act_quant.cuh.j2"
    family: ClassVar[str] = "epilogue"
    scheme: ActivationScheme
    static: bool
    dtype: str
    target: str

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return _act_quant_source(self.scheme, self.static, self.dtype, self.target)[2]

    def extra_context(self) -> dict:
        body, used, _ = _act_quant_source(self.scheme, self.static, self.dtype, self.target)
        return {"body": body, "constants": used}


@attrs.frozen
class QuantizeGatedOutput(StoreOutput):
    """StoreOutput's gated MoE GEMM1 store (same values, same {dtype} rounding) into the tile's token rows in shared
    memory, then the quantization of those rows for GEMM2 by the epilogue's threads (module docstring). It defines
    store_output, so the skeleton calls it as it calls the 16-bit store."""

    template: ClassVar[str] = "epilogue/quantize_output.cuh.j2"
    scheme: ActivationScheme | None = None
    static: bool = False  # the per-tensor scale is read from p.c_scale
    # the threads that run the epilogue (the first `threads` of the CTA) and their barrier; sync_before: their
    # shared memory (the k-slice sums of reduce_warps_k) is read until the barrier before the staging
    threads: str = "cfg::kThreads"
    sync: str = "__syncthreads()"
    sync_before: bool = False

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.scheme is None or not self.gated or self.tile_rows or self.fragment_store or self.topk_weight:
            raise ValueError("QuantizeGatedOutput quantizes the gated store of MoE GEMM1 (gated, row_map, the whole "
                             "tile at once): it needs a scheme and gated, and takes no tile_rows, fragment_store or "
                             "topk_weight")
        if self.out_dtype not in ("bfloat16", "float16"):
            raise ValueError(f"QuantizeGatedOutput rounds to the 16-bit layer dtype, not out_dtype={self.out_dtype!r}")

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        lanes = {"kQuantGroupLanes"} if self.scheme.granularity != "tensor" else set()
        return super().provides | {"kQuantCols", "kQuantStride", "kQuantRowVectors", "quantize_staged"} | lanes

    @property
    def ptx(self) -> tuple[str, ...]:  # type: ignore[override]
        return super().ptx + (("epilogue_sync",) if "epilogue_sync" in self.sync else ())

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        calls = set(ACT_QUANT_CALLS)
        if self.scheme.granularity == "tensor":
            calls -= {"amax_bits", "warp_max_xor", "bits_f32", "block_scale"}
        return super().needs | calls | ({"epilogue_sync"} if "epilogue_sync" in self.sync else set())

    def extra_context(self) -> dict:
        from humming_gen.activation.components import STORE_TYPE

        ctx = super().extra_context()
        s = self.scheme
        vectors = s.group_size // 8 if s.granularity == "group" else 0
        ctx.update(granularity=s.granularity, element=s.dtype.name, scale_dtype=s.scale_dtype.name,
                   group_size=s.group_size, group_lanes=vectors, scale_store_type=STORE_TYPE[s.scale_dtype.bits],
                   stage_pad=STAGE_PAD)
        return ctx


def quantized_store(store: StoreOutput, compute, target: str, warps_k: int = 1) -> list[Component]:
    """The components that replace a gated MoE GEMM1's 16-bit `store` where `compute` quantizes its output: the
    act_quant code and the quantizing store (the standard pipeline's epilogue: warps of k slice 0 alone run it
    where warps_k > 1, meeting on epilogue_sync after reduce_warps_k)."""
    q = compute.epilogue_quantization
    fields = {f.name: getattr(store, f.name) for f in attrs.fields(type(store))}
    sync = {"threads": "cfg::kWarpsMN * 32", "sync": "epilogue_sync()", "sync_before": True} if warps_k > 1 else {}
    return [ActQuantCode(scheme=q, static=compute.epilogue_static_scale, dtype=store.out_dtype, target=target),
            QuantizeGatedOutput(**fields, scheme=q, static=compute.epilogue_static_scale, **sync)]
