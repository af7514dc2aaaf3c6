"""Kernel pipelines, one package each (standard, warp_specialized), behind the `Pipeline` protocol."""

from humming_gen.pipelines.base import ComposeError, KernelPlan, Pipeline

__all__ = ["ComposeError", "KernelPlan", "Pipeline"]
