"""Code generation: compose() picks components, render() assembles the source."""

from humming_gen.codegen.compose import ComposeError, KernelPlan, compose
from humming_gen.codegen.render import render

__all__ = ["ComposeError", "KernelPlan", "compose", "render"]
