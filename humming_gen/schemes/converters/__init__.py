"""Checkpoint converters: quantized checkpoints of common tools -> the standard-form `QuantizedWeight`.

One module per source format (gptq, awq, compressed_tensors, fp8, mxfp4, modelopt, bitnet), each with
`convert(tensors, config)` and `to_checkpoint(qweight, prefix)`; `convert` here selects one from the
quantization_config, `load_layer` reads a layer from a safetensors checkpoint directory.
"""

from humming_gen.schemes.checkpoint import load_layer, read_quantization_config
from humming_gen.schemes.converters.dispatch import CONVERTERS, convert, detect_format

__all__ = ["CONVERTERS", "convert", "detect_format", "load_layer", "read_quantization_config"]
