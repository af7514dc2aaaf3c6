"""Mixture-of-experts on the GPU. Today: routing, `moe_align` (align.py; its generated kernels in kernel.py), which
groups the top-k assignments by expert and pads each expert's run to the GEMM's tile height."""

from humming_gen.moe.align import moe_align
from humming_gen.reference.moe import MoeAlignment

__all__ = ["MoeAlignment", "moe_align"]
