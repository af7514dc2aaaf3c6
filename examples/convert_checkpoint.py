"""Write a small compressed-tensors checkpoint of a 2-layer MLP, convert each layer with `load_layer`, and (with a
GPU) run the converted layers through QuantLinear against the dequantized float reference. Needs the safetensors
package (pip install safetensors).

    python examples/convert_checkpoint.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

try:
    from safetensors.torch import save_file
except ImportError as e:  # a message naming the package and its install command, not a traceback
    sys.exit(f"convert_checkpoint.py: checkpoints are safetensors files and the safetensors package is missing ({e}); "
             f"install it with: pip install safetensors")

import humming_gen
from humming_gen.schemes.converters import compressed_tensors, load_layer
from humming_gen.schemes.scheme import QuantScheme

LAYERS = {"model.mlp.up_proj": (512, 256), "model.mlp.down_proj": (256, 512)}  # name: (N, K)
SCHEME = QuantScheme("uint4", group_size=128, scale_dtype="bfloat16", zero_point="int")  # W4A16 asym, g128


def write_checkpoint(directory: Path, weights: dict[str, torch.Tensor]) -> None:
    """Quantize each float weight and save config.json + model.safetensors in compressed-tensors layout."""
    tensors, config = {}, None
    for name, w in weights.items():
        layer_tensors, config = compressed_tensors.to_checkpoint(SCHEME.quantize(w), name)
        tensors.update(layer_tensors)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                       "quantization_config": config}, indent=1))
    print(f"wrote {len(tensors)} tensors, format {config['format']!r}: "
          f"{sorted(k.rsplit('.', 1)[1] for k in tensors if k.startswith('model.mlp.up_proj'))}")


def run_on_gpu(layers: dict[str, humming_gen.QuantizedWeight]) -> None:
    quant_linear = getattr(humming_gen, "QuantLinear", None)
    if not torch.cuda.is_available() or quant_linear is None:
        why = "no CUDA device" if not torch.cuda.is_available() else "humming_gen.QuantLinear not available"
        print(f"kernel run skipped ({why})")
        return
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    y, ref = x, x.float()
    for name, qw in layers.items():
        layer = quant_linear.from_quantized(qw.to("cuda"), bias=None, dtype=torch.bfloat16)
        y = layer(y)
        ref = ref @ qw.dequantize().cuda().T
        if name.endswith("up_proj"):
            y, ref = torch.relu(y), torch.relu(ref)
    err = (y.float() - ref).abs().max().item() / ref.abs().max().item()
    print(f"QuantLinear MLP vs dequantized float reference: max relative error {err:.2e}")


def main() -> None:
    torch.manual_seed(0)
    weights = {name: torch.randn(n, k) / k ** 0.5 for name, (n, k) in LAYERS.items()}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_checkpoint(directory, weights)
        layers = {}
        for name, w in weights.items():
            qw = load_layer(directory, name)
            layers[name] = qw
            err = (qw.dequantize() - w).abs().max().item()
            print(f"{name:22s} {qw.scheme.summary()}  codes {tuple(qw.codes.shape)}  "
                  f"max |dequant - float| = {err:.4f} (weights' max {w.abs().max().item():.3f})")
        run_on_gpu(layers)


if __name__ == "__main__":
    main()
