"""Activation quantization on the GPU: generated kernels (kernel.py, components.py) and the public
`quantize_activation` (api.py), which returns codes and scales in the layout the GEMM kernels read."""

from humming_gen.activation.api import fake_quantize_activation, quantize_activation

__all__ = ["fake_quantize_activation", "quantize_activation"]
