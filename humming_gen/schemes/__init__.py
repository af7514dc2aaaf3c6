"""Quantization schemes, the standard quantized-weight form, presets and checkpoint converters."""

from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme

__all__ = ["ActivationScheme", "QuantScheme", "QuantizedWeight"]
