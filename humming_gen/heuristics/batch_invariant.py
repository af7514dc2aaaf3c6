"""Batch-invariant tunings: row r's output is bitwise the same for every M and whatever the other rows hold.

A row's fp32 result is fixed by the order in which its K products are summed. An MMA computes each output column
(a token row: activations are the B / N operand in both pipelines) from that column alone, so the tile's token
count may change with M where the instruction does not (mma.sync m16n8k16 always has 8 columns). What may not
change is everything that orders the sum:
- split-K (slices summed in a workspace): split_k = 1 in every bucket;
- the standard pipeline's k split among warps (warps_k, hence block_k = warp_k * warps_k: which k steps each warp
  accumulates and the warps_k reduction after the loop) and where the group scale is applied (to every weight,
  or to the fp32 partial sums of a warp's stage slice: compose decides from the warp's m tiles);
- the warp-specialized pipeline's wgmma m64nNk16 with N = block_m tokens: one token tile for every M;
- the pipeline itself (the two need not agree bitwise), so one pipeline serves every M.
`reduction_order` names these facts for a composed kernel; a batch-invariant plan has one order in all buckets.
"""

from __future__ import annotations

import attrs

from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import TuningPlan
from humming_gen.targets import Target

PIPELINES = ("standard", "warp_specialized")
STANDARD_WARPS_K = 2  # one k split for all M: 4 (the small-M choice) leaves too few registers at 128-token tiles
MIN_WARP_M_NO_SLICE_SCALE = 32  # a warp tile of more than 2 m8 tiles keeps the group scale on the weights


def reduction_order(layer: LayerConfig, tuning: TuningConfig, target: Target) -> tuple:
    """What fixes a row's fp32 summation order in the kernel of `tuning` (compose decides the scale placement)."""
    from humming_gen.codegen import compose

    plan = compose(layer, ComputeConfig(batch_invariant=True), tuning, target)
    slice_scale = any(getattr(c, "slice_scale", False) for c in plan.components)
    if tuning.pipeline == "warp_specialized":
        return (tuning.pipeline, tuning.mma, tuning.block_k, tuning.split_k, tuning.block_m, slice_scale)
    return (tuning.pipeline, tuning.mma, tuning.block_k, tuning.warps_k, tuning.split_k, slice_scale)


def invariance_reasons(layer: LayerConfig, plan: TuningPlan, target: Target) -> list[str]:
    """Why `plan` would let a row's result depend on M (empty: it does not)."""
    reasons = []
    for m_max, t in plan.buckets:
        if t.split_k != 1:
            reasons.append(f"bucket M <= {m_max}: split_k={t.split_k}; batch invariance needs split_k=1 (the "
                           f"number of k slices changes the summation order)")
    orders = {}
    for m_max, t in plan.buckets:
        orders.setdefault(reduction_order(layer, t, target), []).append(m_max)
    if len(orders) > 1:
        listed = "; ".join(f"M <= {ms}: {order}" for order, ms in orders.items())
        reasons.append("the buckets sum K in different orders (pipeline, mma, block_k, warps_k or token tile, "
                       f"split_k, scale on partial sums): {listed}")
    return reasons


def activation_reasons(layer: LayerConfig, static_scale: bool) -> list[str]:
    """Activation quantization whose scales read every row cannot be batch invariant."""
    act = layer.scheme.activation
    if act is None:
        return []
    reasons = []
    if act.granularity == "tensor" and not static_scale:
        reasons.append("per-tensor dynamic activation scales are the amax over all rows of the batch; use a "
                       "static input_scale or per-token / per-group activation scales")
    if act.global_scale and not static_scale:
        reasons.append("a dynamic global activation scale is the amax over all rows of the batch")
    return reasons


def _standard(layer: LayerConfig, target: Target) -> TuningPlan:
    """The standard heuristics' tiles with one k split (STANDARD_WARPS_K), split_k=1 and, where the group scale
    placement would differ between buckets, warp tiles of at least 32 rows; stages and CTAs per SM refitted."""
    from humming_gen.pipelines.standard import STANDARD
    from humming_gen.pipelines.standard.heuristics import _fits

    base = STANDARD.choose_tunings(layer, target)

    def pinned(widen: bool) -> list[tuple[int | None, TuningConfig]]:
        out = []
        for m_max, t in base.buckets:
            warp_k = t.block_k // t.warps_k
            warps_m, block_m = t.warps_m, t.block_m
            if widen and block_m // warps_m < MIN_WARP_M_NO_SLICE_SCALE:
                block_m = warps_m * MIN_WARP_M_NO_SLICE_SCALE
            fields = dict(block_m=block_m, block_n=t.block_n, block_k=warp_k * STANDARD_WARPS_K, warps_m=warps_m,
                          warps_n=t.warps_n, warps_k=STANDARD_WARPS_K)
            ctas = t.ctas_per_sm
            if not _fits(layer, target, fields, 2, ctas):
                ctas = 1
            stages = max([s for s in range(2, t.stages + 1) if _fits(layer, target, fields, s, ctas)], default=2)
            out.append((m_max, attrs.evolve(t, **fields, stages=stages, ctas_per_sm=ctas, split_k=1)))
        return out

    plan = TuningPlan(tuple(pinned(widen=False)))
    if invariance_reasons(layer, plan, target):
        plan = TuningPlan(tuple(pinned(widen=True)))
    return plan


def _warp_specialized(layer: LayerConfig, target: Target) -> TuningPlan:
    """The warp-specialized large-M tuning (its token tile and k order) in every bucket, without split-K."""
    from humming_gen.pipelines.warp_specialized.heuristics import tuning_for

    tuning = attrs.evolve(tuning_for(layer, target, 4096), split_k=1)
    return TuningPlan(((None, tuning),))


def batch_invariant_tunings(layer: LayerConfig, target: Target, pipeline: str | None = None) -> TuningPlan:
    """A plan whose buckets all sum K in one order (see the module docstring).

    pipeline: None or "standard" (every target and format), or "warp_specialized" (sm_90a; faster from a few
    hundred tokens on, slower below). ValueError naming the reasons when the layer cannot be served that way."""
    if pipeline not in (None, *PIPELINES):
        raise ValueError(f"pipeline={pipeline!r}; allowed for batch_invariant=True: None, {PIPELINES}")
    if pipeline == "warp_specialized":
        from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED

        reasons = WARP_SPECIALIZED.supports(layer, ComputeConfig(batch_invariant=True), target)
        if reasons:
            raise ValueError("the warp-specialized pipeline cannot serve this layer:\n  - " + "\n  - ".join(reasons))
        plan = _warp_specialized(layer, target)
    else:
        plan = _standard(layer, target)
    reasons = invariance_reasons(layer, plan, target)
    if reasons:  # our own rule failed: say which, rather than hand out a plan that is not invariant
        raise ValueError(f"no batch-invariant tuning for {layer.summary()} on {target.name}:\n  - "
                         + "\n  - ".join(reasons))
    return plan


def check_batch_invariant(layer: LayerConfig, plan: TuningPlan, target: Target, static_scale: bool = False) -> None:
    """ValueError listing why `plan` (e.g. an explicit tunings=) or the layer's activation scales would let a row's
    result depend on the batch."""
    reasons = activation_reasons(layer, static_scale) + invariance_reasons(layer, plan, target)
    if reasons:
        raise ValueError("batch_invariant=True, but row results would depend on the batch:\n  - "
                         + "\n  - ".join(reasons))
