"""Kernel components, one concern each, grouped by family (ptx, numeric, memory, mma, schedule, epilogue,
pipeline). Tensor roles in generated CUDA: a (activations), b (weights), c (output), a_scale, b_scale, b_zero,
b_global_scale; the public API spells them out (`weight_scale`)."""

from humming_gen.components.base import Component

__all__ = ["Component"]
