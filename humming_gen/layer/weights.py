"""PreparedWeight: a QuantizedWeight packed into the tensors a kernel reads, and the dispatch to the packing of
the kernel's pipeline."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from humming_gen.schemes import QuantizedWeight

if TYPE_CHECKING:
    from humming_gen.pipelines.base import KernelPlan, WeightLayout


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


def scales_fold(qweight: QuantizedWeight) -> bool:
    """Whether the weight's e8m0 group scales fold into the e4m3 weight operand (LayerConfig.fold_scales): the
    scheme allows it (fp8 activations, codes of at most 4 bits such as e2m1) and every row's exponents fit the
    window (components.numeric.exponent_fold). Decided from the data alone, so a layer built twice decides alike;
    where it does not fold, the group scales stay on the promotion path."""
    from humming_gen.components.numeric.exponent_fold import exponent_window, fold_exponents, fold_reasons

    if fold_reasons(qweight.scheme):
        return False
    window = exponent_window(qweight.scheme.weight)
    return window is not None and fold_exponents(qweight.scales, window) is not None


def resolve_device(device: "torch.device | str") -> torch.device:
    """`device` with its index: "cuda" means the current CUDA device, so a layer's device compares equal to its
    tensors' (torch.device("cuda") != torch.device("cuda:0"))."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
