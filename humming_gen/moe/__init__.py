"""Mixture-of-experts on the GPU beside the GEMMs: routing, `moe_align` (align.py; its generated kernels in kernel.py),
which groups the top-k assignments by expert and pads each expert's run to the GEMM's tile height; the row compaction
of the grouped down GEMM (compact.py) and the top-k reduction (reduce.py), both generated kernels QuantMoE runs."""

from humming_gen.moe.align import moe_align
from humming_gen.reference.moe import MoeAlignment

__all__ = ["MoeAlignment", "moe_align"]
