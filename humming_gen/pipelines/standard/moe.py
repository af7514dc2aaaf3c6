"""MoE choices both standard composes (16-bit and 8-bit activations) make the same way: what an MoE gemm type
refuses, its schedule, the stacked expert tensors the kernel rebases and the name suffix (the routing arguments
are pipelines.common.routing_args)."""

from __future__ import annotations

from humming_gen.components.base import Component
from humming_gen.components.schedule.dense import MoeGroupedSchedule, MoeIndexedSchedule
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.pipelines.base import GroupPlan, KernelArg
from humming_gen.pipelines.common import offset_constant

MOE_GEMMS = ("indexed", "grouped_contiguous", "grouped_masked")  # MoE gemm types the standard pipeline generates
_SUFFIX = {"indexed": "_moe", "grouped_masked": "_moe_masked", "grouped_contiguous": "_moe_contiguous"}


def moe_reasons(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig) -> list[str]:
    """What an MoE gemm type (or a dense layer of several experts) cannot be combined with."""
    gather = compute.gemm == "indexed"
    reasons = []
    if compute.epilogue_activation is not None and not gather:
        reasons.append(f"compute.epilogue_activation={compute.epilogue_activation!r} needs gemm='indexed' (MoE GEMM1: "
                       f"gate and up rows interleaved by 8 in each 16-row tile), got gemm={compute.gemm!r}")
    if compute.epilogue_activation is not None and layer.n % 16:
        reasons.append(f"compute.epilogue_activation needs whole 16-row tiles of gate and up rows: n={layer.n} is "
                       f"not a multiple of 16")
    if compute.topk_weight and not gather:
        reasons.append(f"compute.topk_weight with gemm={compute.gemm!r}: the router weights are applied by the "
                       f"caller's combine step for grouped layouts (only 'indexed' multiplies them)")
    if compute.gemm in MOE_GEMMS and tuning.split_k > 1:
        # split-K for the few m blocks of a small batch: the standard pipeline's indexed schedule (slices summed by
        # the last one to arrive, before the epilogue: gated activation, router weight and output quantization apply
        # to the whole sum)
        if tuning.pipeline != "standard":
            reasons.append(f"tuning.split_k={tuning.split_k}: the {tuning.pipeline} pipeline's MoE kernels take "
                           f"split_k=1 (split-K MoE GEMMs are the standard pipeline's, gemm='indexed')")
        elif compute.gemm != "indexed":
            reasons.append(f"tuning.split_k={tuning.split_k}: {compute.gemm} MoE kernels take split_k=1 (split-K "
                           f"MoE GEMMs are gemm='indexed')")
    if compute.gemm not in MOE_GEMMS and layer.num_experts > 1:
        reasons.append(f"layer.num_experts={layer.num_experts}: an MoE layer needs compute.gemm='indexed'")
    return reasons


def moe_schedule(compute: ComputeConfig, split_k: int = 1) -> Component:
    """The tile schedule of an MoE gemm type: the routing's m blocks (indexed, in split_k slices of K) or the
    experts' row windows."""
    if compute.gemm == "indexed":
        return MoeIndexedSchedule(split_k=split_k)
    return MoeGroupedSchedule(masked=compute.gemm == "grouped_masked")


def expert_bytes(layer: LayerConfig, group: GroupPlan | None, n_pad: int, k_pad: int) -> dict[str, int]:
    """Bytes of one expert's slice of each stacked tensor a 16-bit-activation kernel may read (the packed weight,
    group scales and zero terms, the fp32 column scale, the bias), as layer.moe.prepare_moe_weight stacks them."""
    group_bytes = (group.rows if group else 0) * n_pad * 2
    return {"b": n_pad * k_pad * layer.scheme.weight.bits // 8, "b_scale": group_bytes, "b_zero": group_bytes,
            "out_scale": n_pad * 4, "bias": layer.n * 2}


def expert_tensors(args: tuple[KernelArg, ...], expert_bytes: dict[str, int]) -> tuple[tuple[str, str], ...]:
    """(Params field, constant of its bytes per expert) of each stacked weight tensor the kernel reads."""
    return tuple((a.name, f"kExpert{offset_constant(a.name)}Bytes") for a in args if a.name in expert_bytes)


def moe_name_suffix(compute: ComputeConfig) -> str:
    """Kernel-name suffix of an MoE gemm type and its fused epilogue ("" for dense)."""
    if compute.gemm not in MOE_GEMMS:
        return ""
    return (_SUFFIX[compute.gemm] + ("_topkw" if compute.topk_weight else "")
            + (f"_{compute.epilogue_activation}" if compute.epilogue_activation else "")
            + (f"_{compute.topk_reduce}" if compute.topk_reduce else ""))
