"""QuantMoE: a Mixture-of-Experts layer of quantized experts, run as moe_align + two MoE GEMMs + the top-k sum.

x (M, H) -> for each token's top-k experts e: act(x @ w13[e]^T + b13[e]) @ w2[e]^T + b2[e], times the router
weight, summed over the k slots. GEMM1 reads the token rows through the routing and writes one row per assignment,
the gated activation applied in its epilogue where the kernels can (else by torch on its rows); GEMM2 reads them
through the same routing and multiplies by the router weight in its epilogue (indexed), or, in the larger buckets,
reads them compacted into per-expert windows (grouped_contiguous; the router weight then applied by the sum); the k
rows of a token are summed (in fp32, in a fixed order: deterministic).

Schemes that quantize activations (W8A8, W4A8): x is quantized once per forward (humming_gen.quantize_activation,
per token rows) and GEMM1 gathers rows of its codes and their scales; the gated activation's rows are quantized
again for GEMM2, by GEMM1's epilogue where its kernel can (fused_quantization), else by quantize_activation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import torch

import humming_gen.layer.moe_ops  # noqa: F401  (registers the humming_gen::fused_moe / moe_gemm ops)
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.layer.compute_type import kernel_reasons, resolve
from humming_gen.layer.eager import direct_call
from humming_gen.layer.gate_up import gate_up_tile_order, permute_rows
from humming_gen.layer.ops import register_layer
from humming_gen.layer.weights import PreparedWeight, fold_serves, resolve_device, scales_fold, static_input_scale
from humming_gen.schemes import QuantizedWeight, QuantScheme
from humming_gen.targets import Target

if TYPE_CHECKING:
    from humming_gen.config import TuningConfig
    from humming_gen.schemes.scheme import ActivationScheme

_DTYPE_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
TOPK_REDUCES = ("deterministic", "atomic")  # QuantMoE(topk_reduce=...)
DOWN_GEMMS = (None, "indexed", "grouped_contiguous")  # QuantMoE(down_gemm=...)


def _bucket_rows(buckets, index: int) -> int:
    """Rows per expert that pick bucket `index`'s tile in the grouped heuristics: its bound, or twice the last
    finite bound for the open-ended one."""
    bound = buckets[index][0]
    if bound is None:
        finite = [m for m, _ in buckets if m is not None]
        bound = 2 * finite[-1] if finite else 1
    return max(1, math.floor(bound))


def expert_weight(qw: QuantizedWeight, e: int) -> QuantizedWeight:
    """Expert e of an (E, N, K) QuantizedWeight, as a dense one."""
    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or t.dim() == 0 or t.shape[0] != qw.num_experts:
            return t  # shared by every expert (a scalar global scale)
        return t[e]

    if qw.k_perm is not None:
        raise ValueError("MoE weights with an act-order permutation (k_perm) are not served: the kernels read one "
                         "activation row for every expert; convert the checkpoint without act-order")
    return QuantizedWeight(scheme=qw.scheme, codes=qw.codes[e], scales=qw.scales[e], zero_points=pick(qw.zero_points),
                           global_scale=pick(qw.global_scale), channel_scale=pick(qw.channel_scale))


def fused_activation_reasons(q13: QuantizedWeight, activation: str, swiglu_alpha: float,
                             swiglu_limit: float) -> list[str]:
    """Why GEMM1 cannot apply the gated activation in its epilogue for this weight (empty: it can)."""
    from humming_gen.components.epilogue.output import SWIGLU_ALPHA, SWIGLU_LIMIT

    reasons = []
    if q13.scheme.granularity == "block":
        reasons.append(f"w13's {q13.scheme.block_size} block scales cannot follow the tile order of gate/up rows")
    if activation == "swiglu_oai" and (swiglu_alpha, swiglu_limit) != (SWIGLU_ALPHA, SWIGLU_LIMIT):
        reasons.append(f"the fused swiglu uses alpha={SWIGLU_ALPHA}, limit={SWIGLU_LIMIT}; got alpha={swiglu_alpha}, "
                       f"limit={swiglu_limit}")
    return reasons


def fused_quantization_reasons(gemm1_activation: "ActivationScheme | None", gemm2_activation: "ActivationScheme | None",
                               static_scale: bool, fused_activation: bool, intermediate: int,
                               tuning: "TuningConfig | None" = None) -> list[str]:
    """Why GEMM1's epilogue cannot write GEMM2's quantized input (codes and scales in quantize_activation's layout)
    instead of 16-bit act(gate, up) rows (empty: it can). The activation schemes are those the GEMMs run (None:
    16-bit); static_scale: GEMM2's per-tensor scale is a checkpoint's input_scale. With `tuning` (a GEMM1 kernel's),
    also what its pipeline and tile allow: one CTA must hold every element of each scale."""
    from humming_gen.components.epilogue.quantize_output import output_quantization_reasons

    reasons = []
    if gemm2_activation is None:
        return ["GEMM2 reads 16-bit activations: there is nothing to quantize"]
    if not fused_activation:
        reasons.append("GEMM1 does not apply the gated activation in its epilogue (fused_activation), so the "
                       "activation runs between the GEMMs")
    if gemm1_activation is None:
        reasons.append("GEMM1 runs 16-bit activations: only the 8-bit kernels' epilogue quantizes its output")
    if tuning is None:
        if gemm2_activation.granularity == "tensor" and not static_scale:
            reasons.append("a dynamic per-tensor scale needs the amax of every row of the batch, which no CTA holds "
                           "(give a static input_scale to fuse)")
        return reasons
    if tuning.pipeline != "standard":
        reasons.append(f"the {tuning.pipeline} pipeline's epilogue does not quantize its output yet (the standard "
                       f"pipeline's does: pipeline='standard')")
    return reasons + output_quantization_reasons(gemm2_activation, static_scale, 2 * intermediate, tuning.block_n)


def prepare_moe_weight(plan, qw: QuantizedWeight, device: torch.device | str) -> PreparedWeight:
    """Every expert packed for `plan`'s layout and stacked on a leading expert dimension, so expert e's tensors lie
    e x (one expert's bytes) from the start (the kernel's kExpert*Bytes constants)."""
    from humming_gen.layer.weights import prepare_weight

    parts = [prepare_weight(plan, expert_weight(qw, e), device) for e in range(qw.num_experts)]

    def stack(name: str) -> torch.Tensor | None:
        tensors = [getattr(p, name) for p in parts]
        return None if tensors[0] is None else torch.stack(tensors).contiguous()

    return PreparedWeight(layout_key=parts[0].layout_key, b=stack("b"), b_scale=stack("b_scale"),
                          b_zero=stack("b_zero"), out_scale=stack("out_scale"), k_perm=None,
                          b_exponent=stack("b_exponent"))


class QuantMoE(torch.nn.Module):
    """A quantized MoE layer: w13 (E, 2I, H) gate/up rows as `gate_up_layout` stores them ("split": [gate; up],
    vLLM's order; "interleaved": gpt-oss; "up_first"), w2 (E, H, I). Build with `from_float` or `from_quantized`;
    call with (x, topk_weights, topk_ids, expert_map=None).

    Kernels: indexed GEMMs, one pair per bucket of expected rows per expert (M * top_k / E), all compiled at
    construction; no host synchronisation in forward (routing counts stay on the GPU). The standard pipeline serves
    every bucket, except on sm_90a (16-bit or 8-bit activations), where the warp-specialized pipeline takes the
    buckets from 17 rows per expert on, and every bucket where both GEMMs run 8-bit weights with 8-bit activations
    (W8A8; humming_gen.heuristics.moe_tunings; both read one packed weight). pipeline="standard" or
    "warp_specialized" puts every bucket, and the grouped GEMMs (grouped_launcher), on one pipeline (ValueError
    where it cannot serve them).
    split_k: below one row per expert a small batch's few m blocks leave most SMs idle, so a first bucket (bound
    A_s / E rows per expert, a Fraction) splits K in the standard pipeline's GEMMs (None, the default:
    pipelines.standard.heuristics.moe_split_bucket, where its table is); 1 never splits; n > 1 splits every
    standard-pipeline bucket n ways (at most a GEMM's k tiles; for tests and measurements: an open-ended bucket's
    split-K scratch then grows with the batch, so warm it up at the largest M before a CUDA graph capture).
    fused_activation: GEMM1 applies the gated activation in its epilogue (w13 and `bias13` kept with gate and up
    rows in tile order), which spares the (M * top_k, 2I) buffer and the torch activation kernels (Qwen3-30B-A3B
    W4A16 on the H200, M = 4096: 928 us instead of 1231); such a layer has no gate/up GEMM alone (moe_gemm,
    grouped_moe_gemm, launcher_for with "w13" are refused). None (the default) fuses wherever the kernels can
    (`fused_activation_reasons`: not block-scaled w13, nor swiglu with another alpha / limit), True refuses to
    build otherwise, False never fuses; `self.fused_activation` says what the layer does.
    fused_quantization: where GEMM2 quantizes its input (8-bit schemes), GEMM1's epilogue writes GEMM2's codes and
    scales itself, after the fused gated activation (rounded to `dtype` first, so the codes are bitwise those of
    quantize_activation on the unfused rows), instead of 16-bit rows and a quantize_activation kernel. Per bucket:
    where one CTA of its GEMM1 kernel holds every element of each scale (`fused_quantization_reasons`: group scales
    whose group divides the tile's features, per-token scales where the tile covers the whole row, a static
    per-tensor scale; the standard pipeline's kernels). False (the default: on the H200 the fused epilogue measured
    slower, README) never fuses, None fuses the buckets whose reasons are empty, True refuses to build unless every
    bucket fuses; `self.fused_quantization` says which buckets do (a tuple, one bool per bucket).
    A scheme that quantizes activations (8-bit: w8a8-*, w4a8-*) runs them quantized, each GEMM's input with its
    weight's ActivationScheme (a one-element input_scale of a per-tensor scheme is its static scale); where the
    kernels cannot serve it (fp8 needs sm_89+) the GEMM falls back to the next compute type, logged once, as for
    QuantLinear (`compute_dtypes`; strict=True refuses), and weight_only=True runs the weights with 16-bit
    activations. MXFP4-style e8m0 group scales fold into the e4m3 weights of the warp-specialized 8-bit kernels,
    per GEMM, where every row of every expert allows it (`fold_scales`; as QuantLinear). Group-scaled fp8
    activations (MXFP8, fp8 group-32) run on the 8-bit kernels here: QuantLinear's dequantize_activations (their
    values on the 16-bit kernels, its default on sm_90a) has no MoE counterpart yet.
    Batch invariance (no `batch_invariant` option, unlike QuantLinear): within one bucket (`bucket_for(M, top_k)`,
    the same two kernels) a token's output row is bitwise the same in every batch, whatever the other tokens and
    wherever the routing places it: each assignment row's K sum is ordered by its kernel alone (a split-K kernel
    sums its fixed k slices in slice order), per-token / per-group / static per-tensor activation quantization reads
    only the row, and the top-k sum adds a token's k rows in an order set by top_k alone. Across buckets the kernels
    differ (token tile, pipeline, MMA): no promise; a dynamic per-tensor activation scale (the amax of the batch)
    makes every row depend on the others.
    topk_reduce: "deterministic" (the default): GEMM2 writes one row per assignment and a generated kernel sums a
    token's rows in fp32 in a fixed order (humming_gen.moe.reduce; the bits of torch.sum over the slots, then the
    cast). "atomic": GEMM2's epilogue adds each router-weighted row into its token's row of an fp32 (M, H) buffer
    with red.global.add (no (M * top_k, H) rows written and read back), then a cast to the layer's dtype; the order
    of the adds varies, so results may differ in the last bits from run to run (and batch invariance is lost). Such a
    layer has no down GEMM alone (moe_gemm / launcher_for with "w2").
    down_gemm: how a bucket's down GEMM reads and writes its rows. "indexed": through the routing (gathers GEMM1's
    rows, multiplies by the router weight and scatters to the assignment's row in its epilogue). "grouped_contiguous":
    a kernel (humming_gen.moe.compact) first copies GEMM1's rows into per-expert windows, the grouped GEMM reads and
    writes dense windows, and the top-k reduction applies the router weight (weighted_topk_reduce: the fp32 product
    of the weight and the rounded row, where the indexed path rounds the weighted row; both sum in the same order),
    which spares the down GEMM's per-row lookups and scatter (DeepSeek-V3 W4A16 down at M = 4096: README, Speed).
    None (the default): grouped where the heuristics measured it faster (humming_gen.heuristics.moe_down_gemms:
    the warp-specialized open-ended bucket, above 64 rows per expert, and where H >= 4 I the one bounded at 64, 17-64
    rows per expert), with the deterministic top-k reduction and no fused_quantization in the bucket;
    "grouped_contiguous" refuses those. `self.down_gemms` says each bucket's. Batch invariance holds on either path."""

    def __init__(self, q13: QuantizedWeight, q2: QuantizedWeight, *, activation: str = "silu_mul",
                 gate_up_layout: str = "split", bias13: torch.Tensor | None = None, bias2: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16, target: "Target | str | None" = None,
                 device: "torch.device | str | None" = None, compiler: str | None = None,
                 swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0, fused_activation: bool | None = None,
                 weight_only: bool = False, strict: bool = False, pipeline: str | None = None,
                 topk_reduce: str = "deterministic", fused_quantization: bool | None = False,
                 split_k: int | None = None, down_gemm: str | None = None):
        super().__init__()
        from humming_gen.codegen import compose
        from humming_gen.heuristics import choose_tunings, grouped_moe_tuning, moe_down_gemms, moe_tunings
        from humming_gen.kernel import _resolve_target, build_many
        from humming_gen.moe.compact import kernel_for as compact_kernel_for
        from humming_gen.moe.reduce import kernel_for
        from humming_gen.reference.moe import ACTIVATIONS, GATE_UP_LAYOUTS

        for name, q in (("q13", q13), ("q2", q2)):
            if not isinstance(q, QuantizedWeight) or q.codes.dim() != 3:
                raise ValueError(f"{name} must be an (E, N, K) QuantizedWeight, got "
                                 f"{getattr(getattr(q, 'codes', None), 'shape', type(q).__name__)}")
        if weight_only:
            q13, q2 = (attrs.evolve(q, scheme=attrs.evolve(q.scheme, activation=None), input_scale=None)
                       for q in (q13, q2))
        if dtype not in _DTYPE_NAME:
            raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r}; allowed: {ACTIVATIONS}")
        if gate_up_layout not in GATE_UP_LAYOUTS:
            raise ValueError(f"gate_up_layout={gate_up_layout!r}; allowed: {GATE_UP_LAYOUTS}")
        if not isinstance(topk_reduce, str) or topk_reduce not in TOPK_REDUCES:
            raise ValueError(f"topk_reduce={topk_reduce!r}; allowed: {TOPK_REDUCES} ('deterministic': GEMM2 writes "
                             f"a row per assignment, a kernel sums them in a fixed order; 'atomic': GEMM2's epilogue "
                             f"adds them into fp32 token rows, in no fixed order)")
        self.topk_reduce = topk_reduce
        if down_gemm not in DOWN_GEMMS:
            raise ValueError(f"down_gemm={down_gemm!r}; allowed: {DOWN_GEMMS} (None: the heuristics' choice per "
                             f"bucket)")
        if down_gemm == "grouped_contiguous" and topk_reduce == "atomic":
            raise ValueError("down_gemm='grouped_contiguous' writes unweighted rows for the deterministic top-k "
                             "reduction; topk_reduce='atomic' needs the indexed down GEMM (down_gemm='indexed' or "
                             "None)")
        num_experts, two_i, hidden = q13.shape
        if q13.n % 2 or q2.shape != (num_experts, hidden, two_i // 2):
            raise ValueError(f"w13 must be (E, 2I, H) and w2 (E, H, I): got {q13.shape} and {q2.shape}")
        if hidden % 8 or (two_i // 2) % 8:
            raise ValueError(f"hidden ({hidden}) and intermediate ({two_i // 2}) sizes must be multiples of 8 (rows "
                             f"the kernels read in 16-byte pieces)")
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, two_i // 2
        self.activation, self.gate_up_layout = activation, gate_up_layout
        self.swiglu_alpha, self.swiglu_limit = swiglu_alpha, swiglu_limit
        self.dtype = dtype
        self.target = _resolve_target(target)
        # where the target's kernels cannot serve a scheme's quantized activations: the next supported compute type,
        # logged once (humming_gen.layer.compute_type); strict=True refuses
        choices = [resolve(q.scheme, _DTYPE_NAME[dtype], self.target.name,
                           lambda s, q=q, c=c: kernel_reasons(q.n, q.k, s, c, self.target, num_experts=q.shape[0],
                                                              dtype=_DTYPE_NAME[dtype]),
                           strict=strict, weight_only=False,
                           who=f"QuantMoE {name}")
                   for name, q, c in (("q13", q13, ComputeConfig(gemm="indexed")),
                                      ("q2", q2, ComputeConfig(gemm="indexed", topk_weight=True)))]
        q13, q2 = (q if c.scheme == q.scheme else attrs.evolve(q, scheme=c.scheme, input_scale=None)
                   for q, c in zip((q13, q2), choices))
        #: the activation types the two GEMMs multiply (gate/up, down): a scheme's own or a fallback
        self.compute_dtypes = tuple(c.compute_dtype for c in choices)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = resolve_device(device)
        biases = {}
        for name, bias, n in (("bias13", bias13, two_i), ("bias2", bias2, hidden)):
            if bias is not None:
                if tuple(bias.shape) != (num_experts, n):
                    raise ValueError(f"{name} must have shape ({num_experts}, {n}), got {tuple(bias.shape)}")
                biases[name] = bias.detach().to(self.device, dtype).contiguous()
        self.bias13, self.bias2 = biases.get("bias13"), biases.get("bias2")
        reasons = fused_activation_reasons(q13, activation, swiglu_alpha, swiglu_limit)
        if fused_activation and reasons:
            raise ValueError("fused_activation=True: " + "; ".join(reasons))
        self.fused_activation = not reasons if fused_activation is None else bool(fused_activation)
        if self.fused_activation:
            # gate and up of each feature 8 rows apart in every 16-row tile (humming_gen.layer.gate_up)
            order = gate_up_tile_order(self.intermediate, gate_up_layout)
            q13 = permute_rows(q13, order)
            if self.bias13 is not None:
                self.bias13 = self.bias13[:, order.to(self.device)].contiguous()

        # MXFP4-style e8m0 group scales fold into the e4m3 weights of the warp-specialized kernels where every row of
        # every expert allows it (decided per GEMM from the data, as QuantLinear; dropped below where no such kernel
        # serves the GEMM)
        layers = [LayerConfig(n=q.n, k=q.k, scheme=q.scheme, num_experts=num_experts, has_bias=b is not None,
                              dtype=_DTYPE_NAME[dtype], fold_scales=scales_fold(q))
                  for q, b in ((q13, self.bias13), (q2, self.bias2))]
        gated = activation if self.fused_activation else None
        computes = [ComputeConfig(gemm="indexed", epilogue_activation=gated),
                    ComputeConfig(gemm="indexed", topk_weight=True,
                                  topk_reduce="atomic" if topk_reduce == "atomic" else None)]
        # each GEMM's input quantization (None: 16-bit activations) and static per-tensor scale
        self.activation_schemes = tuple(q.scheme.activation for q in (q13, q2))
        # the eager quantize launches of GEMM1's and GEMM2's inputs (humming_gen.activation.api.RowQuantizer), bound
        # on the first quantized call (None: the scheme needs quantize_activation's general path)
        self._row_quantizers: list = [False, False]
        self._static_scales = tuple(self._check_quantized_activations(name, q, layer, compute)
                                    for name, q, layer, compute in zip(("q13", "q2"), (q13, q2), layers, computes))
        # GEMM2's input takes a dynamic per-tensor scale (the amax of every row): rows of skipped assignments are zeros
        act2 = self.activation_schemes[1]
        self._zero_skipped_rows = act2 is not None and act2.granularity == "tensor" and self._static_scales[1] is None
        # buckets of expected rows per expert: the standard pipeline's, the warp-specialized one's from 17 rows per
        # expert on (W8A8: all) where it serves both GEMMs; every bucket of a GEMM shares its weight layout (one
        # packed copy)
        self.pipeline = pipeline  # also the grouped GEMMs' (grouped_launcher)
        self._standard_plans = [choose_tunings(layer, self.target, pipeline="standard") for layer in layers]
        plans = moe_tunings(self._standard_plans, layers, computes, self.target, pipeline=pipeline, split_k=split_k)
        layers = [attrs.evolve(layer, fold_scales=layer.fold_scales and fold_serves(layer, plan, self.target))
                  for layer, plan in zip(layers, plans)]
        self.buckets = [m for m, _ in plans[0].buckets]
        self._most_assignments = self._bucket_assignments()
        # both GEMMs read one routing per batch, padded to one token tile: their buckets must agree
        tiles = [[(m, t.block_m) for m, t in plan.buckets] for plan in plans]
        if tiles[0] != tiles[1]:
            raise ValueError(f"the gate/up and down GEMMs' heuristics chose different M buckets or token tiles "
                             f"({tiles[0]} vs {tiles[1]}); one moe_align routing cannot serve both")
        # GEMM1 writes GEMM2's quantized input itself in the buckets whose kernels can (fused_quantization)
        self.fused_quantization = self._fuse_quantization(fused_quantization, plans[0])
        quantized = (attrs.evolve(computes[0], epilogue_quantization=self.activation_schemes[1],
                                  epilogue_static_scale=self._static_scales[1] is not None)
                     if any(self.fused_quantization) else None)
        composed = [[compose(layer, quantized if index == 0 and fuse else compute, t, self.target)
                     for (_, t), fuse in zip(plan.buckets, self.fused_quantization)]
                    for index, (layer, compute, plan) in enumerate(zip(layers, computes, plans))]
        # the buckets whose down GEMM reads GEMM1's rows in per-expert windows: a grouped kernel each
        self.down_gemms = moe_down_gemms(down_gemm, layers[1], plans[1], self.fused_quantization, topk_reduce)
        grouped_down = [compose(layers[1], ComputeConfig(gemm="grouped_contiguous"),
                                grouped_moe_tuning(self._standard_plans[1], layers[1],
                                                   ComputeConfig(gemm="grouped_contiguous"), self.target,
                                                   _bucket_rows(plans[1].buckets, i), pipeline=t.pipeline,
                                                   moe_layers=layers), self.target)
                        for i, ((_, t), down) in enumerate(zip(plans[1].buckets, self.down_gemms))
                        if down == "grouped_contiguous"]
        assert all(p.layout == gemm[0].layout for gemm in composed for p in gemm), "a GEMM's buckets share its weight"
        assert all(p.layout == composed[1][0].layout for p in grouped_down), "the grouped down GEMMs share w2"
        # their launchers are bound without a scratch bound (below): no split-K
        assert all(p.tuning.split_k == 1 for p in grouped_down), "grouped down GEMMs never split K"
        kernels = build_many(composed[0] + composed[1] + grouped_down, compiler=compiler)
        k13, k2 = kernels[:len(self.buckets)], kernels[len(self.buckets):2 * len(self.buckets)]
        k2_grouped = iter(kernels[2 * len(self.buckets):])
        self.w13 = prepare_moe_weight(composed[0][0], q13, self.device)
        self.w2 = prepare_moe_weight(composed[1][0], q2, self.device)
        self._kernels = list(zip(k13, k2))
        self._layer_configs = layers
        self._compiler = compiler
        self._grouped: dict[tuple[str, str, object], object] = {}  # (weight, gemm, tuning) -> bound launcher
        # (weight, gemm, rows per expert, pipeline) -> the same launchers: a call skips the heuristics (~100 us)
        self._grouped_calls: dict[tuple[str, str, int, str | None], object] = {}
        # split-K kernels' scratch bound for their bucket's most assignments (bound x E), so CUDA graphs never see
        # it move (the heuristic never splits the open-ended bucket; a forced split_k grows its scratch with the batch)
        self._launchers = [(a.bind(self.w13, self.bias13, self.device, most),
                            b.bind(self.w2, self.bias2, self.device, most))
                           for (a, b), most in zip(self._kernels, self._most_assignments)]
        # per bucket: the grouped down GEMM's launcher where down_gemms says so, else None
        self._grouped_down = [next(k2_grouped).bind(self.w2, self.bias2, self.device, None)
                              if down == "grouped_contiguous" else None for down in self.down_gemms]
        if topk_reduce == "deterministic":  # the top-k reduction(s) and the row compaction, compiled with the GEMMs
            if "indexed" in self.down_gemms:
                kernel_for(_DTYPE_NAME[dtype], self.target, compiler)
            if "grouped_contiguous" in self.down_gemms:
                kernel_for(_DTYPE_NAME[dtype], self.target, compiler, weighted=True)
                compact_kernel_for(self.target, compiler)
        self._op_id = register_layer(self)  # the key of this layer in the humming_gen::fused_moe / moe_gemm ops

    def _fuse_quantization(self, requested: bool | None, plan) -> tuple[bool, ...]:
        """Per bucket of GEMM1's plan: its epilogue quantizes GEMM2's input (fused_quantization: None where the
        reasons are empty, True everywhere or ValueError with the reasons, False nowhere)."""
        if requested is not None and not isinstance(requested, bool):
            raise ValueError(f"fused_quantization={requested!r}; allowed: None (fuse the buckets that can), True "
                             f"(require it) or False (never)")
        if requested is False:
            return (False,) * len(plan.buckets)
        static = self._static_scales[1] is not None
        reasons = {m: fused_quantization_reasons(*self.activation_schemes, static, self.fused_activation,
                                                 self.intermediate, t) for m, t in plan.buckets}
        if requested and any(reasons.values()):
            lines = {r: [] for found in reasons.values() for r in found}
            for m, found in reasons.items():
                for r in found:
                    lines[r].append("open" if m is None else f"<= {m}")
            raise ValueError("fused_quantization=True: " + "; ".join(
                f"{r} (buckets of rows per expert {', '.join(ms)})" for r, ms in lines.items()))
        return tuple(not found for found in reasons.values())

    def _check_quantized_activations(self, name: str, q: QuantizedWeight, layer: LayerConfig,
                                     compute: ComputeConfig) -> torch.Tensor | None:
        """ValueError naming why kernels with `q`'s quantized activations cannot run here (as QuantLinear's), else
        the static per-tensor activation scale on the layer's device (a one-element input_scale), or None."""
        from humming_gen.pipelines.standard import STANDARD

        act = q.scheme.activation
        if act is None:
            return None
        reasons = STANDARD.supports(layer, compute, self.target)
        if q.input_scale is not None and act.granularity == "tensor" and q.input_scale.numel() != 1:
            reasons.append(f"{name}.input_scale has {q.input_scale.numel()} values (one per expert?); the GEMM reads "
                           f"one per-tensor activation scale: pass one value (vLLM takes the experts' max)")
        if reasons:
            raise ValueError(
                f"{name}: the scheme quantizes activations ({act.dtype.name}, {act.granularity}), which MoE kernels "
                f"on {self.target.name} cannot serve:\n  - " + "\n  - ".join(reasons)
                + f"\nPass weight_only=True to run the experts with {_DTYPE_NAME[self.dtype]} activations")
        if q.input_scale is None or act.granularity != "tensor":
            return None
        return static_input_scale(q.input_scale, f"QuantMoE: {name}").to(self.device)

    # --- constructors ------------------------------------------------------------------------
    @classmethod
    def from_float(cls, w13: torch.Tensor, w2: torch.Tensor, scheme: "QuantScheme | str", **kwargs) -> "QuantMoE":
        """Quantize float w13 (E, 2I, H) and w2 (E, H, I) with `scheme` (a QuantScheme or preset name)."""
        if isinstance(scheme, str):
            from humming_gen.schemes.presets import preset

            scheme = preset(scheme)
        for name, w in (("w13", w13), ("w2", w2)):
            if not isinstance(w, torch.Tensor) or w.dim() != 3 or not w.is_floating_point():
                raise ValueError(f"{name} must be a float (E, N, K) tensor, got "
                                 f"{getattr(w, 'shape', type(w).__name__)}")
        return cls(scheme.quantize(w13.detach()), scheme.quantize(w2.detach()), **kwargs)

    @classmethod
    def from_quantized(cls, q13: QuantizedWeight, q2: QuantizedWeight, **kwargs) -> "QuantMoE":
        """From (E, N, K) QuantizedWeights (QuantScheme.quantize, humming_gen.convert or load_layer)."""
        return cls(q13, q2, **kwargs)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str, prefix: str, **kwargs) -> "QuantMoE":
        """The experts module `prefix` of a safetensors checkpoint (gpt-oss MXFP4, compressed-tensors, FP8 block,
        ... : humming_gen.load_moe), weight-only (MoeWeights.to_layer): checkpoints whose scheme quantizes
        activations (DeepSeek FP8 block) run with bf16 / fp16 activations. kwargs go to the constructor (dtype,
        target, device; activation overrides the format's)."""
        from humming_gen.schemes.converters.moe import load_moe

        return load_moe(checkpoint_dir, prefix).to_layer(**kwargs)

    # --- run -------------------------------------------------------------------------------------
    def bucket_for(self, m: int, top_k: int) -> int:
        """Index of the bucket that serves M tokens of top_k assignments (by rows per expert, M * top_k / E, against
        bounds that may be fractions: the split-K bucket below one row per expert)."""
        assignments = m * top_k
        for i, most in enumerate(self._most_assignments):  # ints: no Fraction arithmetic per call
            if most is None or assignments <= most:
                return i
        raise AssertionError("the last bucket is open-ended")

    def _bucket_assignments(self) -> list[int | None]:
        """The most assignments (M * top_k) each bucket serves; None for the open-ended one."""
        return [None if m_max is None else math.floor(m_max * self.num_experts) for m_max in self.buckets]

    def block_m(self, m: int, top_k: int) -> int:
        """The token tile moe_align must pad each expert's rows to for this batch."""
        return self._kernels[self.bucket_for(m, top_k)][0].plan.tuning.block_m

    def check_input(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    expert_map: torch.Tensor | None = None) -> None:
        """ValueError / TypeError naming what is wrong with forward's arguments (metadata only: fake tensors pass
        too, so the op's fake implementation runs the same checks)."""
        for name, t in (("x", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if expert_map is not None and not isinstance(expert_map, torch.Tensor):
            raise TypeError(f"expert_map must be a torch.Tensor or None, got {type(expert_map).__name__}")
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be (M, {self.hidden}), got {tuple(x.shape)}")
        if x.dtype != self.dtype or x.device != self.device:
            raise ValueError(f"x is {x.dtype} on {x.device}; this layer was built for {self.dtype} on {self.device}")
        if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
            raise ValueError(f"topk_ids must be (M, top_k) with M = {x.shape[0]}, got {tuple(topk_ids.shape)}")
        if topk_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"topk_ids.dtype is {topk_ids.dtype}; allowed: int32, int64")
        if topk_weights.shape != topk_ids.shape:
            raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got "
                             f"{tuple(topk_weights.shape)}")
        if not topk_weights.is_floating_point():
            raise ValueError(f"topk_weights must be a float tensor, got {topk_weights.dtype}")
        for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights), ("expert_map", expert_map)):
            if t is not None and t.device != self.device:
                raise ValueError(f"{name} is on {t.device}; the layer is on {self.device}")

    def check_out(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """ValueError / TypeError naming what is wrong with a caller's (M, H) output tensor."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (x.shape[0], self.hidden) or out.dtype != self.dtype or out.device != self.device:
            raise ValueError(f"out must be ({x.shape[0]}, {self.hidden}) {self.dtype} on {self.device}, got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device}")

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                expert_map: torch.Tensor | None = None) -> torch.Tensor:
        """(M, H) MoE output through the `humming_gen::fused_moe` op (one opaque call for torch.compile).

        x (M, H) of the layer's dtype; topk_weights / topk_ids (M, top_k) (ids local experts, or global ids with
        `expert_map`: global id -> local expert, -1 for other ranks' experts); -1 ids are skipped."""
        if direct_call(x, topk_weights, topk_ids, expert_map):  # plain eager call: the op's body without its dispatch
            return self.run(x, topk_weights, topk_ids, expert_map)
        self.check_input(x, topk_weights, topk_ids, expert_map)
        return torch.ops.humming_gen.fused_moe(x, self._op_id, topk_weights, topk_ids, expert_map)

    def run(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
            expert_map: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The eager body of the op: moe_align, GEMM1, gated activation, GEMM2 (router weight), the top-k reduction
        (humming_gen.moe.reduce: fp32, deterministic, the bits of torch.sum over the slots then the cast); in the
        buckets of `down_gemms` "grouped_contiguous", the row compaction, the grouped GEMM2 and the weighted sum.
        Never synchronises with the host; `out` (M, H), when given, receives the result."""
        from humming_gen.moe import moe_align
        from humming_gen.moe.compact import compact_offsets
        from humming_gen.moe.reduce import topk_reduce
        from humming_gen.reference.moe import gated_activation

        self.check_input(x, topk_weights, topk_ids, expert_map)
        m, top_k = topk_ids.shape
        if m == 0:
            return torch.empty(0, self.hidden, dtype=self.dtype, device=self.device) if out is None else out
        if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
            x = x.contiguous()  # the kernel reads rows in 16-byte pieces
        bucket = self.bucket_for(m, top_k)
        gemm1, gemm2 = self._launchers[bucket]
        routing = moe_align(topk_ids.contiguous(), self.num_experts, gemm1.kernel.plan.tuning.block_m, expert_map)
        grouped_down = self._grouped_down[bucket]
        # the grouped down GEMM's windows (two torch kernels, before GEMM1: the launches from GEMM1 on overlap by PDL)
        layout = compact_offsets(routing.expert_counts) if grouped_down is not None else None
        a1, a1_scale = self.gemm_input(x, 0)
        # rows of skipped assignments are not written: garbage, which GEMM2 never reads, unless GEMM2's input takes
        # a dynamic per-tensor scale (the amax of every row), when they are zeros (and so is their activation); the
        # grouped down GEMM's windows hold only routed rows (_grouped_down_gemm)
        rows = torch.zeros if self._zero_skipped_rows and grouped_down is None else torch.empty
        if self.fused_quantization[bucket]:  # GEMM1 writes GEMM2's codes and scales, as gemm_input would
            a2, a2_scale = self._quantized_rows(m * top_k)
            gemm1.moe(a1, a2, routing, top_k, a_scale=a1_scale, out_scale=a2_scale)
        elif self.fused_activation:  # GEMM1 writes act(gate, up) itself
            act = rows(m * top_k, self.intermediate, dtype=self.dtype, device=self.device)
            gemm1.moe(a1, act, routing, top_k, a_scale=a1_scale)
        else:
            h = rows(m * top_k, 2 * self.intermediate, dtype=self.dtype, device=self.device)
            gemm1.moe(a1, h, routing, top_k, a_scale=a1_scale)
            act = gated_activation(h.float(), self.activation, self.gate_up_layout, self.swiglu_alpha,
                                   self.swiglu_limit).to(self.dtype)
        if topk_weights.dtype != torch.float32 or not topk_weights.is_contiguous():
            topk_weights = topk_weights.to(torch.float32).contiguous()
        if grouped_down is not None:  # GEMM1's rows into per-expert windows, a grouped GEMM, the weighted sum
            return self._grouped_down_gemm(grouped_down, act, routing, layout, gemm1.kernel.plan.tuning.block_m,
                                           topk_weights, top_k, out)
        if not self.fused_quantization[bucket]:
            a2, a2_scale = self.gemm_input(act, 1)
        if self.topk_reduce == "atomic":  # GEMM2 adds each assignment into its token's fp32 row; skipped slots: none
            total = torch.zeros(m, self.hidden, dtype=torch.float32, device=self.device)
            gemm2.moe(a2, total, routing, 1, topk_weights.view(-1), a_scale=a2_scale, out_top_k=top_k)
            return total.to(self.dtype) if out is None else out.copy_(total)
        # rows of skipped slots stay unwritten: the top-k reduction leaves them out without reading them
        y = torch.empty(m * top_k, self.hidden, dtype=self.dtype, device=self.device)
        gemm2.moe(a2, y, routing, 1, topk_weights.view(-1), a_scale=a2_scale)
        return topk_reduce(y, routing.inverse, top_k, out, target=self.target, compiler=self._compiler)

    def _grouped_down_gemm(self, launcher, act: torch.Tensor, routing, layout: torch.Tensor, block_m: int,
                           topk_weights: torch.Tensor, top_k: int, out: torch.Tensor | None) -> torch.Tensor:
        """The down GEMM on GEMM1's rows `act` copied into per-expert windows (humming_gen.moe.compact; `layout`:
        compact_offsets of the routing), then the router-weighted top-k sum through each assignment's window row."""
        from humming_gen.moe.compact import compact_rows
        from humming_gen.moe.reduce import weighted_topk_reduce

        rows = act.shape[0]
        # rows past the windows' end (skipped assignments) are not written, nor read by the GEMM; a dynamic
        # per-tensor scale's amax reads every row: zeros there
        fill = torch.zeros if self._zero_skipped_rows else torch.empty
        windows = fill(rows, self.intermediate, dtype=self.dtype, device=self.device)
        window_rows = compact_rows(act, routing, block_m, layout, windows, self.target, self._compiler)
        a2, a2_scale = self.gemm_input(windows, 1)
        y = torch.empty(rows, self.hidden, dtype=self.dtype, device=self.device)
        launcher.grouped(a2, y, layout, a_scale=a2_scale)
        return weighted_topk_reduce(y, window_rows, topk_weights.view(-1), top_k, out, target=self.target,
                                    compiler=self._compiler)

    def gemm_input(self, a: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """GEMM `index`'s (0: w13, 1: w2) input rows `a` (rows, K) as its kernels read them: `a` itself with 16-bit
        activations, else (codes, fp32 scales) of humming_gen.quantize_activation with the GEMM's activation scheme
        (and static scale): codes in rows of 16-byte stride, scales per row of `a` (or one per tensor, the amax of
        every row of `a`)."""
        scheme = self.activation_schemes[index]
        if scheme is None:
            return a, None
        quantizer = self._row_quantizers[index]
        if quantizer is False:  # first quantized call: bind the launch where one kernel serves the scheme
            from humming_gen.activation.api import RowQuantizer

            quantizer = self._row_quantizers[index] = RowQuantizer.create(
                scheme, a.dtype, a.shape[1], a.device, self._static_scales[index])
        if quantizer is not None and a.stride(1) == 1 and a.stride(0) * a.element_size() % 16 == 0 \
                and a.data_ptr() % 16 == 0:
            return quantizer.tensors(a)
        from humming_gen.activation import quantize_activation

        qa = quantize_activation(a, scheme, static_scale=self._static_scales[index])
        return qa.codes, qa.scales

    def _quantized_rows(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """GEMM2's input buffers for a GEMM1 that quantizes its output, in quantize_activation's layout: codes (rows,
        I) in rows of 16-byte stride, and the scales per row (or the static per-tensor scale). Rows of skipped
        assignments are not written (GEMM2 never reads them)."""
        scheme = self.activation_schemes[1]
        ldq = -(-self.intermediate // 16) * 16
        codes = torch.empty(rows, ldq, dtype=torch.uint8, device=self.device)[:, :self.intermediate]
        static = self._static_scales[1]
        if static is not None:
            return codes, static
        groups = self.intermediate // scheme.group_size if scheme.granularity == "group" else 1
        from humming_gen.activation.api import _SCALE_TORCH

        return codes, torch.empty(rows, groups, dtype=_SCALE_TORCH.get(scheme.scale_dtype.name, torch.uint8),
                                  device=self.device)

    def gemm_index(self, weight: str) -> int:
        """The index (0: w13, 1: w2) of GEMM `weight` run alone; ValueError for another name, for w13 when its
        epilogue applies the gated activation (its rows are in tile order and it writes act(gate, up)), or for w2
        when it adds into token rows (topk_reduce='atomic')."""
        if weight not in ("w13", "w2"):
            raise ValueError(f"weight={weight!r}; allowed: 'w13' (gate/up GEMM) or 'w2' (down GEMM)")
        if weight == "w13" and self.fused_activation:
            raise ValueError("this layer's w13 GEMM applies the gated activation in its epilogue (as the default, "
                             "fused_activation=None, does wherever the kernels can) and holds gate/up rows in tile "
                             "order: build the layer with fused_activation=False to run the gate/up GEMM alone")
        if weight == "w2" and self.topk_reduce == "atomic":
            raise ValueError("this layer's w2 GEMM adds each assignment into its token's row (topk_reduce='atomic'): "
                             "build the layer with topk_reduce='deterministic' to run the down GEMM alone")
        return 0 if weight == "w13" else 1

    def launcher_for(self, weight: str, rows: int, block_m: int):
        """The bound launcher of GEMM `weight` ("w13" or "w2") whose token tile is `block_m`: the bucket of `rows`
        assignment rows when its tile matches, else the nearest bucket with that tile above it, or the last below
        it (for callers that bring their own routing, padded to block_m)."""
        index = self.gemm_index(weight)
        tiles = self.block_ms
        if block_m not in tiles:
            raise ValueError(f"block_m={block_m}: this layer's kernels tile {sorted(set(tiles))} rows; pad the "
                             f"routing to one of them (layer.block_m(M, top_k) gives the one for a batch)")
        preferred = self.bucket_for(rows, 1)
        if tiles[preferred] == block_m:
            return self._launchers[preferred][index]
        # the first bucket of that tile above the rows' one, else the last below: never the split-K bucket beyond
        # its bound (its scratch is bound for at most its assignments; the unsplit bucket of its tile follows it)
        same = [i for i, tile in enumerate(tiles) if tile == block_m]
        bucket = next((i for i in same if i > preferred), same[-1])
        return self._launchers[bucket][index]

    def grouped_launcher(self, weight: str, gemm: str, rows_per_expert: int, pipeline: str | None = None):
        """The bound launcher of a grouped MoE kernel ("grouped_masked" or "grouped_contiguous") for GEMM `weight`,
        tiled for about `rows_per_expert` rows per expert (a hint: the kernels walk every m block of each expert's
        rows whatever the tile; grouped_moe_gemm passes its expected_m, else max_m or R / E); compiled on first use
        (warm up before a CUDA graph capture). It reads the layer's packed weights, on the pipeline an indexed GEMM
        of that many rows per expert takes (humming_gen.heuristics.grouped_moe_tuning: warp-specialized from 17 rows
        per expert on sm_90a, a W8A8 layer's at any count); `pipeline` forces "standard" or "warp_specialized";
        without it the layer's own pipeline= applies where that pipeline serves the grouped GEMM."""
        from humming_gen.codegen import compose
        from humming_gen.heuristics import grouped_moe_tuning
        from humming_gen.kernel import build_many
        from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED

        index = self.gemm_index(weight)
        if gemm not in ("grouped_masked", "grouped_contiguous"):
            raise ValueError(f"gemm={gemm!r}; allowed: 'grouped_masked', 'grouped_contiguous'")
        call = (weight, gemm, rows_per_expert, pipeline)
        launcher = self._grouped_calls.get(call)
        if launcher is not None:
            return launcher
        layer, compute = self._layer_configs[index], ComputeConfig(gemm=gemm)
        if pipeline is None:  # the layer's own pipeline=, where that pipeline serves grouped GEMMs of this weight
            pipeline = self.pipeline
            if pipeline == "warp_specialized" and WARP_SPECIALIZED.supports(layer, compute, self.target):
                pipeline = "standard"  # e.g. group sizes the warp-specialized kernels do not serve
        tuning = grouped_moe_tuning(self._standard_plans[index], layer, compute, self.target, rows_per_expert,
                                    pipeline=pipeline, moe_layers=self._layer_configs)
        key = (weight, gemm, tuning)
        launcher = self._grouped.get(key)
        if launcher is None:
            plan = compose(layer, compute, tuning, self.target)
            kernel = build_many([plan], compiler=self._compiler)[0]
            launcher = kernel.bind(self.w13 if index == 0 else self.w2, self.bias13 if index == 0 else self.bias2,
                                   self.device, None)
            self._grouped[key] = launcher
        if len(self._grouped_calls) >= 1024:  # a bound on the distinct row counts remembered
            self._grouped_calls.clear()
        self._grouped_calls[call] = launcher
        return launcher

    @property
    def fold_scales(self) -> tuple[bool, bool]:
        """Per GEMM (w13, w2): its e8m0 group scales fold into the e4m3 weight operand of the warp-specialized
        kernels (names ending in `_fold`); the standard buckets promote the group scales of the same packed weight.
        False: every kernel of that GEMM promotes them (a row of some expert spans too many binades, or the scheme
        or target does not fold)."""
        return self._layer_configs[0].fold_scales, self._layer_configs[1].fold_scales

    @property
    def block_ms(self) -> list[int]:
        """The token tile of each bucket's kernels (the block_m its routing is padded to)."""
        return [gemm1.kernel.plan.tuning.block_m for gemm1, _ in self._launchers]

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"activation={self.activation}, gate_up_layout={self.gate_up_layout}, dtype={self.dtype}, "
                f"target={self.target.name}, buckets={self.buckets}, fused_activation={self.fused_activation}"
                + (f", fold_scales={self.fold_scales}" if any(self.fold_scales) else "")
                + (f", fused_quantization={self.fused_quantization}" if any(self.fused_quantization) else "")
                + (f", topk_reduce={self.topk_reduce}" if self.topk_reduce != "deterministic" else "")
                + (f", down_gemms={self.down_gemms}" if "grouped_contiguous" in self.down_gemms else "")
                + (f", split_k={self.split_ks}" if any(k > 1 for pair in self.split_ks for k in pair) else ""))

    @property
    def split_ks(self) -> list[tuple[int, int]]:
        """Each bucket's (gate-up, down) k slices (1: unsplit)."""
        return [(a.kernel.plan.tuning.split_k, b.kernel.plan.tuning.split_k) for a, b in self._launchers]
