"""PreparedWeight: a QuantizedWeight packed into the tensors a kernel reads, and the dispatch to the packing of
the kernel's pipeline."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import torch

from humming_gen.schemes import QuantizedWeight

if TYPE_CHECKING:
    from humming_gen.config import LayerConfig
    from humming_gen.pipelines.base import KernelPlan, TuningPlan, WeightLayout
    from humming_gen.targets import Target


@attrs.define
class PreparedWeight:
    """Kernel-layout tensors. Every kernel whose plan has the same `layout` (its `layout_key`) can read them."""

    layout_key: "WeightLayout"
    b: torch.Tensor
    b_scale: torch.Tensor | None
    b_zero: torch.Tensor | None
    out_scale: torch.Tensor | None
    k_perm: torch.Tensor | None
    # folded e8m0 group scales: per (row, k32 step) exponent deltas (components.numeric.exponent_fold)
    b_exponent: torch.Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.b, self.b_scale, self.b_zero, self.out_scale, self.b_exponent) if t is not None)


def layout_key(plan: "KernelPlan") -> "WeightLayout":
    """Kernels with equal keys read the same prepared tensors."""
    return plan.layout


def prepare_weight(plan: "KernelPlan", qw: QuantizedWeight, device: "torch.device | str") -> PreparedWeight:
    """Pad, repack and convert a dense QuantizedWeight for `plan`'s kernels (through its pipeline's packing)."""
    from humming_gen.pipelines.registry import get_pipeline

    return get_pipeline(plan.pipeline).prepare_weight(plan, qw, device)


def static_input_scale(input_scale: torch.Tensor, owner: str) -> torch.Tensor:
    """A checkpoint's per-tensor input_scale as the one-element fp32 static activation scale, refused unless it is
    positive and finite: the kernels divide by it unchecked (a negative scale mis-rounded codes, a zero one gives
    infinities). Read once when the layer is built (one host sync there, none in forward)."""
    scale = input_scale.detach().reshape(1).to(torch.float32)
    value = float(scale.cpu()[0])
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{owner}.input_scale: a static activation scale must be positive and finite, got {value!r}")
    return scale


def scales_fold(qweight: QuantizedWeight) -> bool:
    """Whether the weight's e8m0 group scales fold into the e4m3 weight operand (LayerConfig.fold_scales): the
    scheme allows it (fp8 activations, codes of at most 4 bits such as e2m1) and every row's exponents fit the
    window (components.numeric.exponent_fold), of every expert for an (E, N, K) MoE weight (its kernels are
    composed once for all experts). Decided from the data alone, so a layer built twice decides alike; where it
    does not fold, the group scales stay on the promotion path."""
    from humming_gen.components.numeric.exponent_fold import (empty_groups, exponent_window, fold_exponents,
                                                              fold_reasons)

    if fold_reasons(qweight.scheme):
        return False
    window = exponent_window(qweight.scheme.weight)
    if window is None:
        return False
    groups = qweight.scales.shape[-1]
    rows = qweight.scales.reshape(-1, groups)  # (E, N, groups): the experts' rows one after another
    empty = empty_groups(qweight.codes, qweight.scheme.weight, qweight.scheme.group_size).reshape(-1, groups)
    return fold_exponents(rows, window, empty) is not None


def fold_serves(layer: "LayerConfig", tunings: "TuningPlan", target: "Target") -> bool:
    """Folded scales are read by warp-specialized kernels only, whose rings hold a stage's exponent deltas beside
    its weights: some tuning must be one, and every one must still fit shared memory (explicit tunings chosen for
    the unfolded layer may not; they win, and the layer promotes its group scales instead)."""
    from humming_gen.pipelines.registry import get_pipeline

    ws = [t for t in tunings.tunings() if t.pipeline == "warp_specialized"]
    plan = get_pipeline("warp_specialized").shared_memory
    return bool(ws) and all(plan(layer, t).total <= target.smem_per_block_optin for t in ws)


def resolve_device(device: "torch.device | str") -> torch.device:
    """`device` with its index: "cuda" means the current CUDA device, so a layer's device compares equal to its
    tensors' (torch.device("cuda") != torch.device("cuda:0"))."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
