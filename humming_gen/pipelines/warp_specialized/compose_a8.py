"""compose() of the warp-specialized pipeline (sm_90a) for schemes with 8-bit activations: wgmma k32 with int8 x int8
or fp8 x fp8 operands, the weights as the register A operand and the activation codes (tokens on N) read from
shared memory. Weights keep the standard 8-bit layout (BLayout8, or BLayoutNibble8 for weights of at most 4 bits,
128-row blocks of two 64-row warp slices, 64-k slices), so one packed copy serves the standard pipeline's small-M
buckets and these kernels: a 128-row tile is one layout block, consumer warpgroup g takes warp slice g and its warp
w the slice's 16-row tile w.

Scales as on the standard pipeline: per-channel / tensor weight scales and per-token / tensor activation scales
multiply the output in the epilogue; group and block scales multiply the partial sums when they are promoted into
the fp32 accumulators, every kPromoteK = gcd(block_k, group sizes); the producer stages a stage's group scales with
it (the tile's weight scales by bulk copy, fp32 activation scales by cp.async, MXFP8's e8m0 bytes by 4-byte cp.async
where K is whole stages, else global reads: staged_e8m0_scales), so a promotion reads shared memory. Folded e8m0
group scales (LayerConfig.fold_scales, components.numeric.exponent_fold) are no promoted groups: the widened
weights carry them, their exponent deltas
staged after each stage's weights, and the rows' factor multiplies the output with out_scale. fp8 partial sums are promoted at least every
block_k (128) k, since wgmma's fp8 accumulation keeps fewer than fp32's bits (DeepSeek-V3 report, section 3.3.2:
about 14 bits on H800; DeepGEMM promotes every 128 k likewise); int8 ones are exact s32 over the whole of K.

MoE (indexed, as the 16-bit warp-specialized MoE and the standard 8-bit one): per-expert weights, scales and biases
rebased per unit, rows of activation codes gathered through the routing by the producer, each token column's
activation scales (per token in the epilogue, per group at promotion) those of the row its assignment reads,
sorted_ids[m] / top_k; router-weight multiply and the fused gated epilogue as for 16-bit activations. Folded group
scales: each expert's exponent deltas and row factors (b_exponent, out_scale) rebased with its weights (indexed and
grouped). Grouped layouts read dense row windows of codes and their rows' activation scales
(MoeGroupedPersistentSchedule).
"""

from __future__ import annotations

import math

import attrs

from humming_gen.components.base import Component
from humming_gen.components.epilogue.output import (SplitKParallelReduce, StoreOutput, StoreOutputRows,
                                                    StoreOutputStaged)
from humming_gen.components.epilogue.topk_atomic import fused_topk_store, output_dtype
from humming_gen.components.mma.atoms import WGMMA_M64NNK16_WARP
from humming_gen.components.mma.wgmma import WGMMA_8BIT_TYPE, WGMMA_N, WgmmaRS8, WgmmaSS8
from humming_gen.components.numeric.exponent_fold import ROWS as EXPONENT_ROWS
from humming_gen.components.numeric.exponent_fold import STEP_K, ExponentFold
from humming_gen.components.numeric.nibble8 import NibbleToE4m3, NibbleToInt8
from humming_gen.components.ptx.wrappers import wrappers_for
from humming_gen.components.schedule.dense import PersistentSchedule
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.config.tuning import BAND_M, PANEL_LOADS
from humming_gen.pipelines.base import KernelPlan, PersistentLaunch, compose_error
from humming_gen.pipelines.common import (SHARED_LAYOUT, common_reasons, constants_table, has_out_scale, kernel_name,
                                          missing_features, missing_symbols, padded_k, split_k_constants,
                                          split_k_reasons)
from humming_gen.pipelines.standard import compose_a8 as standard_a8
from humming_gen.pipelines.standard.moe import expert_tensors, moe_name_suffix, moe_reasons
from humming_gen.pipelines.warp_specialized import compose as ws_compose
from humming_gen.pipelines.warp_specialized.compose import (GROUPED_GEMMS, MOE_GEMMS, STAGING_BYTES,
                                                            expert_prefix_bytes, moe_persistent_schedule,
                                                            moe_tuning_reasons, ring_reasons, staged_store,
                                                            staging_bytes)
from humming_gen.pipelines.warp_specialized.components import (ActivationScalesStage, ATilePanelsBulk,
                                                               ATileSw128CpAsync, WarpSpecializedA8Pipeline,
                                                               WeightStageBulk, WeightWiden, ring_barrier_bytes)
from humming_gen.schemes.packing import BLayout8, BLayoutNibble8, BLayoutSw128
from humming_gen.schemes.quantize import PANEL_K
from humming_gen.targets import Target

BLOCK_N = SHARED_LAYOUT["block_n"]  # one layout block per tile
SLICE_K = SHARED_LAYOUT["warp_k"]
WARPGROUPS = 2  # one per 64-row warp slice of the layout block
PRODUCER_THREADS = 128
PRODUCER_REGISTERS = 40
# b_operand='widened': warps 1-3 of the producer warpgroup (ws_compose.WIDEN_THREADS) widen nibbles (widen_unit) in
# ws_compose.WIDEN_REGISTERS, their lookups and addresses (56 spills 12 bytes); the consumers get what is left
# (consumer_registers: 216 of the 3 x 168 the CTA holds)
SMEM_ALIGN = 1024
MAX_BLOCK_M = 192  # fp32 accumulators and partial sums: block_m registers of a consumer thread's 232
# int8 x int8 with channel scales keeps one set of s32 sums over the whole of K (no promotion): block_m / 2 registers,
# so wgmma's widest N fits (256 tokens: no spills, 4 stages; opt-in, unmeasured)
MAX_BLOCK_M_UNPROMOTED = 256
PROMOTE_K_FP8 = 128  # k between promotions of fp8 partial sums at the most
# Shared-weight (SS) tiles of fewer tokens keep one set of partial sums: each half's wgmmas read the 64 weight rows
# from shared memory again, so halves of small tiles cost more shared-memory bandwidth than their overlap saves.
# H200, N = K = 8192, graph us with the quantization (bench/ss_bench.py --small-one-set), halves -> one set:
# fp8 block128 M = 16 / 64 / 128 25.0 / 28.3 / 38.5 -> 24.5 / 27.8 / 31.7 (register weights 24.8 / 28.0 / 33.5),
# fp8 channel 23.2 / 25.5 / 31.9 -> 22.9 / 24.3 / 29.9 (24.5 / 26.1 / 32.6).
SHARED_OVERLAP_FROM_BLOCK_M = 128
# Tokens-on-M tiles of 128 weight rows promote one m64n128 set of partial sums per consumer warpgroup; True: two
# overlapped 64-row halves (m64n64 wgmmas, each re-reading the warpgroup's 64 tokens), one promoted while the other's
# wgmmas run. H200, fp8 block128 8192 x 8192 at M = 256 (the one bucket that takes these tiles there), graph us with
# the quantization (bench/ss_bench.py, 2026-12-03): halves 47.6, one set 42.8 (register weights 49.7, swapped shared
# weights 52.2; Humming 44.5 in another run of the day). Both GPU-tested (tests/gpu/test_linear_w8a8_ss.py).
TOKENS_M_OVERLAP = False
# Promoted partial sums in two token halves of their own wgmmas, one half promoted while the other's run (the two
# consumer warpgroups read the same stages in step, so without it both promote at once and the tensor cores idle;
# with it, only a stage's last half is promoted with nothing in flight), where overlaps_promotion says so. False renders the single-set loop everywhere (for measurements:
# bench/a8_sweep.py 'overlap', bench/group32_case.py --variants).
OVERLAP_PROMOTION = True
# MXFP8's e8m0 activation group scales staged with the codes (4-byte cp.asyncs of a token's groups of a stage)
# instead of read from global memory at every promotion. H200, MXFP4 weights x MXFP8, M = 4096 (bench/group32_case.py
# --variants), us read / staged: 3072 x 4096 733.2 / 429.9 at 64 tokens, 355.0 staged at 128; 14336 x 4096 3221.6 /
# 1826.2, 1500.9 at 128. False reads them from global memory (for measurements).
STAGE_E8M0_SCALES = True


@attrs.frozen
class SmemPlanA8:
    a: int
    b: int
    stages: int
    exponents: int = 0  # folded group scales: the stage's exponent deltas, after its weights
    weight_scales: int = 0  # promoted group scales staged with the stage: the tile's weight scales, then
    activation_scales: int = 0  # the tokens' activation scales
    staging: int = 0  # the consumer warps' epilogue staging, after the barriers (compose.staging_bytes)
    widened: int = 0  # b_operand='widened': the stage's weight panel of 8-bit codes, 1024-aligned after the rest

    @property
    def panel_offset(self) -> int:
        """Where a stage's widened weight panel starts (the 128-byte swizzle needs 1024-byte alignment)."""
        used = self.a + self.b + self.exponents + self.weight_scales + self.activation_scales
        return -(-used // SMEM_ALIGN) * SMEM_ALIGN

    @property
    def stage(self) -> int:
        return self.panel_offset + self.widened  # (the panel is whole 1024-byte rows of 8 swizzle atoms)

    @property
    def barriers(self) -> int:
        return ring_barrier_bytes(bool(self.widened))

    @property
    def total(self) -> int:
        return self.stages * (self.stage + self.barriers) + self.staging + SMEM_ALIGN  # + barriers, staging, slack

    def fits(self, target: Target, reserved: int = 0) -> bool:
        """`reserved`: static shared memory (a grouped MoE schedule's expert prefix, expert_prefix_bytes)."""
        return self.total + reserved <= target.smem_per_block_optin


def b_slice_bytes(layer: LayerConfig) -> int:
    """Bytes of one (128-row layout block, 64-k slice) of the packed weight: bytes, or nibbles."""
    return BLOCK_N * SLICE_K // (2 if standard_a8.nibble_order(layer) else 1)


def exponent_stage_bytes(layer: LayerConfig, block_k: int) -> int:
    """Bytes of a stage's exponent deltas (a byte per row and k32 step), 0 where the group scales do not fold."""
    return EXPONENT_ROWS * block_k // STEP_K if layer.fold_scales else 0


def stage_groups(block_k: int, group_k: int) -> int:
    """Scale groups of `group_k` along K that a stage (k tiles start at multiples of block_k) reaches into at most:
    a stage starts at an offset into its first group that is a multiple of gcd(block_k, group_k)."""
    return 1 + -(-(block_k - math.gcd(block_k, group_k)) // group_k)


def tile_weight_scale(layer: LayerConfig) -> bool:
    """Weight blocks of at least a tile's 128 rows: one weight scale per tile and group (DeepSeek's 128 x 128)."""
    s = layer.scheme
    return s.granularity == "block" and s.block_size[0] % BLOCK_N == 0


def weight_scale_bytes(layer: LayerConfig, block_n: int = BLOCK_N) -> int:
    """Bytes staged of one weight scale group of a tile: its 128 rows' fp32 scales, or 16 (a bulk copy's least) per
    128-row layout block of which the first is the block's one scale."""
    return 16 * (block_n // BLOCK_N) if tile_weight_scale(layer) else BLOCK_N * 4


def staged_activation_scales(layer: LayerConfig) -> bool:
    """fp32 activation group scales are staged with the codes (4-byte cp.async); e8m0 bytes: staged_e8m0_scales."""
    return standard_a8.activation_group_k(layer) is not None and not standard_a8.activation_e8m0(layer)


def staged_e8m0_scales(layer: LayerConfig, block_k: int) -> bool:
    """e8m0 activation group scales (MXFP8) staged with the codes as bytes (STAGE_E8M0_SCALES): a token's groups of
    a stage are 4, 8 or 16 bytes copied by 4-byte cp.asyncs, where K is whole stages (no group past K in a copy);
    elsewhere they are read from global memory at each promotion."""
    g = standard_a8.activation_group_k(layer)
    return (STAGE_E8M0_SCALES and g is not None and standard_a8.activation_e8m0(layer) and block_k % g == 0
            and block_k // g in (4, 8, 16) and layer.k % block_k == 0)


def staged_scale_bytes(layer: LayerConfig, block_k: int) -> int:
    """Bytes of one staged activation scale: 4 (fp32), 1 (e8m0, STAGE_E8M0_SCALES), 0 where none is staged."""
    return 4 if staged_activation_scales(layer) else 1 if staged_e8m0_scales(layer, block_k) else 0


def shared_memory(layer: LayerConfig, tuning: TuningConfig) -> SmemPlanA8:
    t = tuning
    w_group, a_group = promoted_weight_group_k(layer), standard_a8.activation_group_k(layer)
    w_scales = stage_groups(t.block_k, w_group) * weight_scale_bytes(layer, t.block_n) if w_group is not None else 0
    scale_bytes = staged_scale_bytes(layer, t.block_k)
    a_scales = stage_groups(t.block_k, a_group) * t.block_m * scale_bytes if scale_bytes else 0
    return SmemPlanA8(a=t.block_m * t.block_k, b=(t.block_n // BLOCK_N) * (t.block_k // SLICE_K) * b_slice_bytes(layer), stages=t.stages,
                      exponents=exponent_stage_bytes(layer, t.block_k), weight_scales=w_scales,
                      activation_scales=a_scales, staging=staging_bytes(layer, t),
                      widened=t.block_n * t.block_k if t.b_operand == "widened" else 0)


def producer_registers(tuning: TuningConfig) -> int:
    return ws_compose.WIDEN_REGISTERS if tuning.b_operand == "widened" else PRODUCER_REGISTERS


def consumer_registers(tuning: TuningConfig | None = None) -> int:
    """(ws_compose.consumer_registers: the budgets share the registers the CTA holds at launch)"""
    producer = PRODUCER_REGISTERS if tuning is None else producer_registers(tuning)
    return ws_compose.consumer_registers(WARPGROUPS, producer)


def promoted_weight_group_k(layer: LayerConfig) -> int | None:
    """K extent of the weight scale groups that multiply promoted partial sums: none where they fold."""
    return None if layer.fold_scales else standard_a8.weight_group_k(layer)


def overlaps_promotion(layer: LayerConfig, tuning: TuningConfig) -> bool:
    """Whether the promoted partial sums come in two token halves (OVERLAP_PROMOTION; the switch itself is the
    caller's). Halves read the register weights twice per token: where 4-bit weights are widened and promoted once a
    stage, tiles under 192 tokens (halves under 96) keep one set, measured faster at 128. Integer wgmma takes N of 8,
    16, 24, 32 or a multiple of 16, so int8 halves must be one of those. H200, M = 4096 (bench/a8_sweep.py overlap; bench/group32_case.py), us
    overlapped / one set: fp8 channel 8192^2 192 tokens 500.5 / 518.3, 128 565.3 / 587.6; block128 708.5 / 786.9;
    W4A8 MXFP4 192 550.8 / 574.8, 128 701.3 / 631.8 (and 151.7 / 139.8 at 3072 x 4096); group-32 activation
    scales (four promotions a stage), 64 tokens: fp32 392.4 / 395.2, e8m0 729.0 / 1035.1."""
    integer = layer.scheme.activation.dtype.name == "int8"
    wgroups = promoted_weight_group_k(layer) is not None
    agroups = standard_a8.activation_group_k(layer) is not None
    half = tuning.block_m // 2
    if tuning.b_operand != "registers" and tuning.block_m < SHARED_OVERLAP_FROM_BLOCK_M:
        return False
    if not (not integer or wgroups or agroups or not exact_k(layer)) or tuning.block_m % 16:
        return False  # nothing promoted in the loop (the skeleton's promote_in_loop), or halves off wgmma's n step
    if integer and half > 32 and half % 16:
        return False
    once_a_stage = promote_k(layer, tuning.block_k) == tuning.block_k
    nibbles = standard_a8.nibble_order(layer) is not None
    return not (nibbles and once_a_stage and tuning.block_m < 192)


def promote_k(layer: LayerConfig, block_k: int) -> int:
    """k between promotions of the partial sums: the stage (fp8: at most PROMOTE_K_FP8), or a scale group."""
    groups = [g for g in (promoted_weight_group_k(layer), standard_a8.activation_group_k(layer)) if g is not None]
    k = math.gcd(block_k, *groups) if groups else block_k
    return k if layer.scheme.activation.dtype.name == "int8" and exact_k(layer) else math.gcd(k, PROMOTE_K_FP8)


def operand_reasons(layer: LayerConfig) -> list[str]:
    """wgmma k32 multiplies int8 x int8 or fp8 x fp8 (u8 forms are not generated): what else stays standard."""
    if standard_a8.scheme_reasons(layer):
        return []  # the standard pipeline's reasons say it already
    w, a = standard_a8.weight_operand(layer), layer.scheme.activation.dtype.name
    if w in WGMMA_8BIT_TYPE and a in WGMMA_8BIT_TYPE and w.startswith("int") == a.startswith("int"):
        return []
    return [f"{w} weights x {a} activations: the warp-specialized 8-bit kernels multiply int8 x int8 or fp8 x fp8 "
            f"(the standard pipeline serves this)"]


def exact_k(layer: LayerConfig) -> bool:
    """s32 partial sums of int8 x int8 stay exact over the whole of K (|code product| <= 2^14, so up to 2^16 k with
    a margin; beyond, they are promoted every stage)."""
    return layer.k <= 1 << 16


def tuning_reasons(tuning: TuningConfig) -> list[str]:
    t = tuning
    reasons = ring_reasons(t, weight_multicast=True, a_bulk=True)
    if t.cluster_n > 1 and (t.split_k > 1 or t.a_load != "tma_multicast"):
        reasons.append(f"tuning cluster={t.cluster_m}x{t.cluster_n} with split_k={t.split_k}, a_load={t.a_load!r}: "
                       f"cluster pairs along N share whole tiles' activation stages (split_k=1, a_load='tma_multicast')")
    if t.cluster_m > 1 and (t.split_k > 1 or t.raster != "n_major"):
        reasons.append(f"tuning cluster={t.cluster_m}x{t.cluster_n} with split_k={t.split_k}, raster={t.raster!r}: "
                       f"cluster pairs walk whole tiles n-major (split_k=1, raster='n_major')")
    if t.block_n != BLOCK_N and not (t.tokens_on == "m" and t.block_n == 2 * BLOCK_N and t.block_k == 128):
        reasons.append(f"tuning.block_n={t.block_n}: with 8-bit activations a tile is one {BLOCK_N}-row layout block "
                       f"(two with tokens_on='m' and block_k=128)")
    if (t.warps_m, t.warps_n, t.warps_k) != (1, 4 * WARPGROUPS, 1):
        reasons.append(f"tuning warps={t.warps_m}x{t.warps_n}x{t.warps_k}: two consumer warpgroups, warps 1x8x1")
    if t.block_m not in WGMMA_N or t.block_m > MAX_BLOCK_M_UNPROMOTED:
        reasons.append(f"tuning.block_m={t.block_m}: a multiple of 8 up to {MAX_BLOCK_M} tokens (fp32 accumulators "
                       f"and partial sums of the wgmma N dimension share a consumer thread's registers; "
                       f"{MAX_BLOCK_M_UNPROMOTED} for int8 without promotion)")
    if t.block_k not in (128, 256):
        reasons.append(f"tuning.block_k={t.block_k}: 128 or 256 (one or two 128-byte swizzle panels of 8-bit codes)")
    if t.raster not in ("n_major", "m_band"):
        reasons.append(f"tuning.raster={t.raster!r}: the persistent grid walks 'n_major' or 'm_band'")
    if t.split_k > 1 and t.raster == "m_band":
        reasons.append(f"tuning.split_k={t.split_k} with raster='m_band': bands are walked without split-K")
    return reasons


def shared_operand_reasons(compute: ComputeConfig, tuning: TuningConfig) -> list[str]:
    """What weights read by wgmma from shared memory need whatever their packing (b_operand 'shared' or 'widened'): a
    dense GEMM and no cluster."""
    t = tuning
    reasons = []
    if compute.gemm in MOE_GEMMS:
        reasons.append(f"b_operand={t.b_operand!r} with gemm={compute.gemm!r}: MoE GEMMs read the weights from "
                       f"registers (their small buckets run the standard pipeline on the register layout)")
    if t.cluster_m * t.cluster_n > 1:
        reasons.append(f"b_operand={t.b_operand!r} with cluster={t.cluster_m}x{t.cluster_n}: generated without "
                       f"clusters")
    return reasons


def shared_weight_reasons(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig) -> list[str]:
    """What b_operand='shared' (wgmma reads the weights from shared memory, packed in BLayoutSw128) needs: 8-bit
    weight codes as the MMA multiplies them, and shared_operand_reasons."""
    reasons = []
    if standard_a8.nibble_order(layer) is not None:
        reasons.append(f"b_operand='shared' with {layer.scheme.weight.name} weights: the shared-memory operand is "
                       f"the stored 8-bit codes (weights of at most 4 bits widen in registers: b_operand='registers', "
                       f"or into shared memory: 'widened')")
    return reasons + shared_operand_reasons(compute, tuning)


def widened_reasons(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig) -> list[str]:
    """What b_operand='widened' (the producer warpgroup's warps 1-3 widen each stage's nibbles into a BLayoutSw128
    panel that wgmma reads) needs: weights of at most 4 bits in the register kernels' nibble layout,
    shared_operand_reasons, and a producer whose warp 0 alone copies: activation codes by bulk copy (a_load='tma')
    with no cp.async-staged activation scales; one 128-row layout block a tile."""
    t = tuning
    reasons = []
    if standard_a8.nibble_order(layer) is None:
        reasons.append(f"b_operand='widened' with {layer.scheme.weight.name} weights: nibbles (weights of at most 4 "
                       f"bits) are widened; 8-bit weights are read from shared memory as stored (b_operand='shared')")
    reasons += shared_operand_reasons(compute, t)
    if t.a_load != "tma":
        reasons.append(f"b_operand='widened' with a_load={t.a_load!r}: the producer warpgroup's warp 0 alone copies, "
                       f"so the activation codes come by one bulk copy a stage (a_load='tma')")
    if staged_scale_bytes(layer, t.block_k):
        reasons.append("b_operand='widened' with activation group scales: they are staged by all 128 producer threads' "
                       "cp.asyncs, and warps 1-3 of the producer warpgroup widen instead")
    if t.block_n != BLOCK_N:
        reasons.append(f"b_operand='widened' with block_n={t.block_n}: one {BLOCK_N}-row layout block a tile")
    return reasons


def tokens_m_reasons(layer: LayerConfig, tuning: TuningConfig) -> list[str]:
    """What tokens_on='m' (the tokens wgmma's A operand, 64 a consumer warpgroup, the weight panel B) needs beyond
    shared weights: 128-token tiles, no split-K, and scales constant along a token row of the tile within each
    promotion: weight blocks of at least the tile's 128 rows (one scale a tile and group) or channel / tensor weight
    scales, activation group scales staged with the stage (fp32, or e8m0 where staged_e8m0_scales)."""
    t = tuning
    reasons = []
    if t.block_m != 2 * 64:
        reasons.append(f"tokens_on='m' with block_m={t.block_m}: two consumer warpgroups of 64 tokens (block_m=128)")
    if t.split_k > 1:
        reasons.append(f"tokens_on='m' with split_k={t.split_k}: whole tiles (split_k=1); the split-K hand-off "
                       f"reads swap-AB fragments")
    if promoted_weight_group_k(layer) is not None and not tile_weight_scale(layer):
        reasons.append(f"tokens_on='m' with weight scales per group of {standard_a8.weight_group_k(layer)} k and "
                       f"{layer.scheme.block_size[0] if layer.scheme.granularity == 'block' else 1} row(s): they vary "
                       f"along a token row's columns; tokens_on='m' takes channel / tensor scales or blocks of at least "
                       f"{BLOCK_N} rows")
    if standard_a8.activation_group_k(layer) is not None and not staged_scale_bytes(layer, t.block_k):
        reasons.append(f"tokens_on='m' with e8m0 activation group scales that are not staged (K={layer.k}, "
                       f"block_k={t.block_k}): K must be whole stages")
    return reasons


def promotes(layer: LayerConfig) -> bool:
    """Partial sums are promoted into the accumulators inside the k loop (fp8, group scales, or s32 over K past
    2^16); int8 x int8 with channel or tensor scales keeps one set of s32 sums over the whole of K."""
    integer = layer.scheme.activation.dtype.name == "int8"
    return (not integer or promoted_weight_group_k(layer) is not None
            or standard_a8.activation_group_k(layer) is not None or not exact_k(layer))


def panels_reasons(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig) -> list[str]:
    """What a_load='tma' (a stage's activation codes by one bulk copy, from the panels layout of
    quantize_activation(layout="panels")) needs: a dense GEMM (MoE rows are gathered or windowed), whole 128-k
    panels (K a multiple of 128) and one panel per stage; 'tma_multicast' (two CTAs along N, each copying half the
    tile's rows into both) also pairs of n tiles and halves of whole 8-row atoms."""
    reasons = []
    if tuning.a_load == "tma_multicast":
        if math.ceil(layer.n / BLOCK_N) % 2:
            reasons.append(f"tuning.a_load='tma_multicast' with N={layer.n}: cluster pairs take two n tiles, so the "
                           f"{math.ceil(layer.n / BLOCK_N)} tiles of {BLOCK_N} rows must be even")
        if tuning.block_m % 16:
            reasons.append(f"tuning.a_load='tma_multicast' with block_m={tuning.block_m}: each CTA copies half the "
                           f"tile's rows, whole 8-row swizzle atoms (block_m a multiple of 16)")
    if compute.gemm in MOE_GEMMS:
        reasons.append(f"tuning.a_load='tma' with gemm={compute.gemm!r}: MoE kernels read rows of codes "
                       f"(a_load='cp_async'); the panels layout serves dense layers")
    if layer.k % PANEL_K:
        reasons.append(f"tuning.a_load='tma' with K={layer.k}: the panels layout needs K a multiple of {PANEL_K}")
    if tuning.block_k != PANEL_K:
        reasons.append(f"tuning.a_load='tma' with block_k={tuning.block_k}: one {PANEL_K}-k panel per stage")
    return reasons


def a8_moe_tuning_reasons(tuning: TuningConfig, gather: bool) -> list[str]:
    """What an MoE kernel with 8-bit activations needs of the tuning beyond a dense one (`gather`: indexed)."""
    reasons = moe_tuning_reasons(tuning, element_bytes=1) if gather else []
    if tuning.raster != "n_major":
        reasons.append(f"tuning.raster={tuning.raster!r}: MoE units walk each m block's n tiles ('n_major')")
    return reasons


def compose(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target) -> KernelPlan:
    """The components of one warp-specialized kernel with 8-bit activations; ComposeError lists what is off."""
    s, a = layer.scheme, layer.scheme.activation
    t = tuning
    moe = compute.gemm in MOE_GEMMS
    gather = compute.gemm == "indexed"  # rows through the routing; grouped types read row windows
    grouped = compute.gemm if compute.gemm in GROUPED_GEMMS else ""
    reasons = (common_reasons(layer, compute, target, quantized_activations=True, moe_gemms=MOE_GEMMS)
               + standard_a8.scheme_reasons(layer) + operand_reasons(layer) + tuning_reasons(t)
               + moe_reasons(layer, compute, t))
    reasons += a8_moe_tuning_reasons(t, gather) if moe else []
    widened = t.b_operand == "widened"
    shared_weights = t.b_operand != "registers"  # the consumers read the weights' panels from shared memory
    reasons += shared_weight_reasons(layer, compute, t) if t.b_operand == "shared" else []
    reasons += widened_reasons(layer, compute, t) if widened else []
    tokens_m = t.tokens_on == "m"
    reasons += tokens_m_reasons(layer, t) if tokens_m else []
    a_bulk = t.a_load in PANEL_LOADS
    reasons += panels_reasons(layer, compute, t) if a_bulk else []
    if moe and t.cluster_m * t.cluster_n > 1:
        reasons.append(f"tuning cluster={t.cluster_m}x{t.cluster_n}: MoE units of one expert are not paired; "
                       f"clusters serve dense layers")
    order = standard_a8.nibble_order(layer)
    layout: BLayout8 | BLayoutNibble8 | BLayoutSw128 = (
        BLayoutSw128(block_n=BLOCK_N) if t.b_operand == "shared" else BLayout8(**SHARED_LAYOUT) if order is None
        else BLayoutNibble8(**SHARED_LAYOUT, order=order))
    reasons += layout.check() + split_k_reasons(layer, t)
    if reasons:
        raise compose_error(reasons)
    wgroups = promoted_weight_group_k(layer) is not None
    fold = layer.fold_scales
    agroups = standard_a8.activation_group_k(layer) is not None
    integer = a.dtype.name == "int8"
    if t.block_m > MAX_BLOCK_M and not (integer and not wgroups and not agroups and exact_k(layer)):
        raise compose_error([f"tuning.block_m={t.block_m}: above {MAX_BLOCK_M} tokens only for int8 x int8 with "
                             f"channel or tensor scales and K <= 2^16 (one set of s32 sums, no promotion); this "
                             f"layer promotes partial sums ({a.dtype.name} activations, weight groups {wgroups}, "
                             f"activation groups {agroups})"])

    numeric: list[Component] = []
    if order == "int8":
        numeric.append(NibbleToInt8(weight=s.weight.name))
    elif order == "e4m3":
        numeric.append(ExponentFold(weight=s.weight) if fold else NibbleToE4m3(weight=s.weight))
    memory: list[Component] = [ATilePanelsBulk(dtype=a.dtype.name, multicast=t.cluster_n > 1) if a_bulk
                               else ATileSw128CpAsync(dtype=a.dtype.name, bytes=1, gather=gather),
                               WeightStageBulk(group_params=(), exponents=fold, weight_scales=wgroups,
                                               cluster_m=t.cluster_m,
                                               block_scales=tokens_m and wgroups and tile_weight_scale(layer))]
    if widened:
        memory.append(WeightWiden(weight=s.weight.name, order=order, fold=fold))
    scale_bytes = staged_scale_bytes(layer, t.block_k)
    e8m0_staged = scale_bytes == 1
    if scale_bytes:
        memory.append(ActivationScalesStage(gather=gather, e8m0=e8m0_staged))
    # tokens on M: promoted partial sums of a 128-row tile in two 64-row halves, overlapped as the token halves below;
    # of a 256-row tile, two 128-row parts one at a time (two sets of 128 would outgrow the registers)
    overlap = OVERLAP_PROMOTION and (TOKENS_M_OVERLAP and promotes(layer) and t.block_n == BLOCK_N if tokens_m
                                     else overlaps_promotion(layer, t))
    if tokens_m:
        mma_n = t.block_n if not promotes(layer) else BLOCK_N // 2 if overlap else BLOCK_N
    else:
        mma_n = t.block_m // 2 if overlap else t.block_m
    mma: list[Component] = [
        WgmmaSS8(weight=standard_a8.weight_operand(layer), activation=a.dtype.name, n=mma_n, tokens_a=tokens_m)
        if shared_weights else WgmmaRS8(weight=standard_a8.weight_operand(layer), activation=a.dtype.name, n=mma_n)]
    banded = t.raster == "m_band"
    schedule: list[Component] = [moe_persistent_schedule(compute) if moe else
                                 PersistentSchedule(split_k=t.split_k, group_m=BAND_M if banded else 1,
                                                    cluster_m=t.cluster_m, cluster_n=t.cluster_n)]
    epilogue: list[Component] = []
    if t.split_k > 1:
        epilogue.append(SplitKParallelReduce(split_k=t.split_k, sync="consumer_sync()",
                                             leader=f"threadIdx.x == {PRODUCER_THREADS}"))
    # indexed MoE: each row to its assignment's row of c (times its token's activation scale and router weight), or
    # the gated activation of GEMM1, one 8-token m tile at a time (tile_rows: 16 m tiles' rows beside the accumulators
    # spill); grouped MoE: the dense rows of the unit below its window's end (p.m, for_expert)
    staged = staged_store(layer, t) and compute.topk_reduce is None  # (atomic top-k reduction: unstaged adds)
    out_scale = has_out_scale(s) or fold  # folded group scales leave each weight row's 2^r with the output columns
    if tokens_m:  # dense whole tiles of token rows (tokens_m_reasons)
        epilogue.append(StoreOutputRows(dtype=layer.dtype, out_dtype=layer.out_dtype, out_scale=out_scale,
                                        bias=layer.has_bias, token_scale="" if agroups else a.granularity))
    else:
        epilogue.append(fused_topk_store(compute, (StoreOutputStaged if staged else StoreOutput)(
            dtype=layer.dtype, out_dtype=layer.out_dtype, out_scale=out_scale, bias=layer.has_bias,
            atom=WGMMA_M64NNK16_WARP, token_scale="" if agroups else a.granularity, fragment_store=t.split_k > 1,
            row_map=gather, topk_weight=compute.topk_weight, gated=compute.epilogue_activation or "",
            tile_rows=gather,
            **({"prefetch_rows": True} if staged and gather and ws_compose.PREFETCH_CHUNK_ROWS else {}))))
    n_pad = math.ceil(layer.n / BLOCK_N) * BLOCK_N
    # MoE: the stacked weight tensors rebased to a unit's expert, with their bytes per expert (folded: the exponent
    # deltas and the row factors in out_scale, per expert like the group scales they replace)
    per_expert = standard_a8.expert_bytes(layer, n_pad)
    experts = expert_tensors(standard_a8.args(layer, False, fold=fold), per_expert) if moe else ()
    pdl = target.has("pdl")
    suffix = (f"_ws_q{standard_a8.activation_name(layer)}" + ("_pa" if a_bulk else "") + moe_name_suffix(compute)
              + ("_fold" if fold else "") + (f"_c{t.cluster_m}" if t.cluster_m > 1 else "")
              + (f"_cn{t.cluster_n}" if t.cluster_n > 1 else "")
              + ("_wd" if widened else "_ss" if shared_weights else "") + ("_tm" if tokens_m else ""))
    # _pa: activation codes in the panels layout; _fold: folded group scales; _c2: two-CTA clusters along M (shared
    # weight stages); _cn2: along N (shared activation stages); _ss: weights read from shared memory; _wd: nibbles
    # widened into shared memory by the producer warpgroup; _tm: tokens on wgmma's M
    name = kernel_name(layer, t, target, suffix=suffix)
    pipeline = WarpSpecializedA8Pipeline(kernel_name=name, weight=s.weight.name, activation=a.dtype.name,
                                         block_m=t.block_m, integer=integer, weight_groups=wgroups,
                                         activation_groups=agroups, nibbles=order is not None and not widened,
                                         pdl=pdl,
                                         banded=banded, activation_e8m0=standard_a8.activation_e8m0(layer),
                                         split_k=t.split_k > 1, long_k=integer and not exact_k(layer), fold=fold,
                                         tile_weight_scale=wgroups and tile_weight_scale(layer),
                                         expert_tensors=experts, grouped=grouped, staged_store=staged,
                                         cluster_m=t.cluster_m, cluster_n=t.cluster_n, shared_weights=shared_weights,
                                         a_bulk=a_bulk, overlap=overlap, staged_e8m0=e8m0_staged,
                                         tokens_m=tokens_m, block_n=t.block_n, widened=widened)
    body = numeric + memory + mma + schedule + epilogue + [pipeline]
    components = (tuple(wrappers_for(body, layer.dtype, output_dtype(layer, compute), layer.has_bias, t.block_m // 8))
                  + tuple(body))
    reasons = missing_features(components, target) + missing_symbols(components)
    smem = shared_memory(layer, t)
    prefix = expert_prefix_bytes(layer, compute)
    if not smem.fits(target, prefix):
        static = f" + {prefix} B static" if prefix else ""
        reasons.append(f"shared memory {smem.total} B (stages={t.stages} x {smem.stage} B){static} exceeds "
                       f"{target.name}'s {target.smem_per_block_optin} B per block")
    if reasons:
        raise compose_error(reasons)

    k_pad = padded_k(layer)
    pk = promote_k(layer, t.block_k)
    threads = PRODUCER_THREADS * (1 + WARPGROUPS)
    constants = constants_table(layer, n_pad, k_pad) + [
        ("kBlockM", t.block_m, "tokens per tile (wgmma " + ("M, 64 a consumer warpgroup)" if tokens_m else "N)")),
        ("kBlockN", t.block_n, "weight rows per tile" + (" (wgmma N)" if tokens_m else "")),
        ("kBlockK", t.block_k, ""),
        ("kNTiles", -(-n_pad // t.block_n), "tiles along N"), ("kKTiles", math.ceil(layer.k / t.block_k), ""),
        ("kStages", t.stages, "ring depth"), ("kStepsPerStage", t.block_k // 32, "k32 wgmma steps per stage"),
        ("kPromoteK", pk, "k between promotions of partial sums into the accumulators"),
        ("kPromoteSteps", pk // 32, ""),
        ("kThreads", threads, "one producer and two consumer warpgroups"),
        ("kProducerThreads", PRODUCER_THREADS, ""), ("kConsumerThreads", 128 * WARPGROUPS, ""),
        ("kProducerRegisters", producer_registers(t), "setmaxnreg budgets"
         + (" (the producer warpgroup's warps 1-3 widen)" if widened else "")),
        ("kConsumerRegisters", consumer_registers(t), ""),
    ] + ([] if tokens_m else [
        ("kWarpNTiles", 1, "16-row n tiles per consumer warp"),
        ("kWarpMTiles", t.block_m // 8, "8-token accumulator groups"),
    ]) + [
        ("kBSliceBytes", b_slice_bytes(layer), "one 128-row layout block x 64 k of packed weight"),
    ] + ([("kBPanelBytes", BLOCK_N * 128, "one 128-row x 128-k panel of BLayoutSw128 weights"),
          ("kBPanelOffset", smem.panel_offset if widened else smem.a, "a stage's weight panels"
           + (", widened from its nibbles" if widened else ", after its activation codes"))] if shared_weights
         else []) + ([("kWidenThreads", ws_compose.WIDEN_THREADS, "warps 1-3 of the producer warpgroup")]
                     if widened else []) + [
        ("kSlicesPerStage", t.block_k // SLICE_K, ""),
        ("kSlicesPerN", k_pad // SLICE_K, "64-k slices per layout block of the packed weight"),
        ("kSmemAlign", SMEM_ALIGN, ""),
        ("kWarpsMN", 4 * WARPGROUPS, "consumer warps (the split-K hand-off's warp count)"),
    ] + split_k_constants(t)
    scales_offset = smem.a + smem.b + smem.exponents  # a stage's staged group scales, after its weights
    if wgroups:
        wg = standard_a8.weight_group_k(layer)
        constants += [("kWeightGroupK", wg, "k elements per weight scale group"),
                      ("kWeightGroups", math.ceil(k_pad / wg), "weight scale groups along the padded K"),
                      ("kStageWeightGroups", stage_groups(t.block_k, wg), "weight scale groups staged per stage"),
                      ("kWeightScaleBytes", weight_scale_bytes(layer, t.block_n), "staged bytes of one group: "
                       + ("each 128-row layout block's one scale, padded to a bulk copy" if tokens_m and
                          tile_weight_scale(layer) else "the tile's one scale, padded to a bulk copy"
                          if tile_weight_scale(layer) else "the tile's rows")),
                      ("kWeightScaleOffset", scales_offset, "a stage's weight group scales, after its weights")]
    if fold:
        constants += [("kExponentOffset", smem.a + smem.b, "a stage's exponent deltas, after its weights"),
                      ("kExponentStageBytes", smem.exponents, "128 rows x kBlockK / 32 deltas: [128-k block][row] words"),
                      ("kExponentBlockBytes", EXPONENT_ROWS * k_pad // STEP_K, "one layout block's deltas along K")]
    if agroups:
        g = standard_a8.activation_group_k(layer)
        constants += [("kActivationGroupK", g, "k elements per activation scale group"),
                      ("kActivationGroups", math.ceil(layer.k / g), "activation scale groups per token")]
    if scale_bytes:
        order = "[kBlockM][group slot] e8m0 bytes" if e8m0_staged else "[group slot][kBlockM] fp32"
        constants += [("kStageActivationGroups", stage_groups(t.block_k, g), "activation scale groups per stage"),
                      ("kActivationScaleOffset", scales_offset + smem.weight_scales,
                       f"a stage's activation group scales: {order}, after the weight scales")]
    elif gather and agroups:  # e8m0 scales read from global memory through the consumers' row lookup
        constants.append(("kActivationRowRegs", -(-t.block_m // 32), "registers of a warp's lanes holding the "
                          "activation row of each token of the unit, one per 32 tokens"))
    constants += [(constant, per_expert[name], f"bytes of one expert's {name}") for name, constant in experts]
    constants += [("kNumExperts", layer.num_experts, "")] if grouped else []
    constants += [("kAStageBytes", smem.a, ""), ("kStageBytes", smem.stage, "")]
    constants += [("kStagingBytes", STAGING_BYTES, "a consumer warp's epilogue staging")] if staged else []
    launch = PersistentLaunch(n_tiles=-(-n_pad // t.block_n), block_m=t.block_m, block_n=t.block_n, split_k=t.split_k,
                              slots=target.sm_count, experts=layer.num_experts if moe else 1,
                              moe_gemm=compute.gemm if moe else "", cluster_m=t.cluster_m, cluster_n=t.cluster_n)
    return KernelPlan(layer=layer, compute=compute, tuning=t, target=target, pipeline="warp_specialized",
                      kernel_name=name, components=components, constants=tuple(constants),
                      args=standard_a8.args(layer, t.split_k > 1, compute, fold=fold, panels=a_bulk),
                      layout=standard_a8.weight_layout(layer, layout, n_pad),
                      group=None, shared_bytes=smem.total, threads=threads, pdl=pdl, launch=launch)
