"""A gpt-oss-shaped MoE layer from a checkpoint in gpt-oss's MXFP4 layout, routed, run and checked.

The experts are written as gpt-oss stores them (`gate_up_proj_blocks / _scales / _bias`, `down_proj_*` under
`model.layers.0.mlp.experts`: e2m1 nibbles, two per byte, 32 per block with one e8m0 scale; gate and up rows
interleaved; swiglu with alpha 1.702 and limit 7) into a temporary safetensors checkpoint, read back with
`humming_gen.load_moe`, built into a QuantMoE and run on tokens routed by a linear router (top-4, softmax over the
chosen logits, as gpt-oss does). The output is compared with the float64 `humming_gen.reference_fused_moe` on the
dequantized experts (the script fails unless the relative error is below TOLERANCE), and `humming_gen.fused_moe`
(vLLM's `fused_experts` arguments) must give the same bits.

    python examples/moe.py            # E = 8, H = 512, I = 256, top-4, 64 tokens
    python examples/moe.py --real     # gpt-oss-120b's layer: E = 128, H = I = 2880, 4 tokens
    python examples/moe.py --cpu      # without a GPU (the default there): build the kernels for sm_90a only
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import humming_gen as hg

PREFIX = "model.layers.0.mlp.experts"
# bf16 activations, GEMM1's output and the gated activation rounded to bf16 between the kernels: the bound of
# tests/gpu/test_quant_moe.py (the H200 measures 3.6e-3 here)
TOLERANCE = 2e-2
p = argparse.ArgumentParser()
p.add_argument("--real", action="store_true", help="gpt-oss-120b's sizes (E = 128, H = I = 2880)")
p.add_argument("--cpu", action="store_true", help="build the kernels for sm_90a, run nothing on a GPU")
p.add_argument("--tokens", type=int, default=None)
args = p.parse_args()
E, H, I, TOP_K = (128, 2880, 2880, 4) if args.real else (8, 512, 256, 4)
M = args.tokens or (4 if args.real else 64)
gpu = torch.cuda.is_available() and not args.cpu

# 1. A checkpoint's tensors: random codes and scales (2^-9 .. 2^-5) in gpt-oss's layout, bf16 biases.
g = torch.Generator().manual_seed(0)
tensors = {}
for name, n, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
    tensors[f"{PREFIX}.{name}_blocks"] = torch.randint(0, 256, (E, n, k // 32, 16), dtype=torch.uint8, generator=g)
    tensors[f"{PREFIX}.{name}_scales"] = torch.randint(118, 123, (E, n, k // 32), dtype=torch.uint8, generator=g)
    tensors[f"{PREFIX}.{name}_bias"] = (torch.randn(E, n, generator=g) * 0.1).bfloat16()

# 2. Written as a checkpoint directory and read back by prefix (load_moe reads only the experts' tensors).
with tempfile.TemporaryDirectory() as checkpoint:
    try:
        from safetensors.torch import save_file

        save_file(tensors, str(Path(checkpoint) / "model.safetensors"))
        (Path(checkpoint) / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "mxfp4"}}))
        experts = hg.load_moe(checkpoint, PREFIX)
    except ImportError:  # no safetensors: the converter load_moe calls, on the dict itself
        from humming_gen.schemes.converters.moe import convert_moe

        print("safetensors is not installed: converting the tensors without writing a checkpoint")
        experts = convert_moe(tensors, {"quant_method": "mxfp4"}, PREFIX)
print(f"experts: w13 {experts.q13.shape} w2 {experts.q2.shape} {experts.q13.scheme.summary()}, "
      f"gate/up {experts.gate_up_layout}, {experts.activation}")

# 3. A router: logits of a linear layer, the top-4 experts, softmax over their logits.
device = "cuda" if gpu else "cpu"
x = torch.randn(M, H, generator=g).to(device, torch.bfloat16)
router = torch.randn(E, H, generator=g).to(device) / H ** 0.5
logits, topk_ids = torch.topk(x.float() @ router.T, TOP_K, dim=-1)
topk_weights = torch.softmax(logits, dim=-1)

# 4. The float64 reference on the experts these tokens use (dequantized; the kernels must match it).
used = topk_ids.unique().cpu()
local_ids = torch.searchsorted(used, topk_ids.cpu())


def dequantized(q: hg.QuantizedWeight) -> torch.Tensor:
    return hg.QuantizedWeight(q.scheme, q.codes[used], q.scales[used]).dequantize(torch.float64)


reference = hg.reference_fused_moe(x.cpu().double(), dequantized(experts.q13), dequantized(experts.q2),
                                   topk_weights.cpu(), local_ids, activation=experts.activation,
                                   gate_up_layout=experts.gate_up_layout, bias13=experts.bias13[used],
                                   bias2=experts.bias2[used])
print(f"reference: {M} tokens over {used.numel()} of {E} experts, output norm {reference.norm():.3f}")

# 5. The layer: kernels for every bucket of rows per expert compiled at construction.
build = {} if gpu else dict(target="sm_90a", device="cpu")
moe = experts.to_layer(dtype=torch.bfloat16, **build)
print(f"QuantMoE: {moe.extra_repr()}")
if not gpu:
    print(f"no GPU here: built the kernels of {len(moe.buckets)} buckets for sm_90a; run this on a GPU to run the "
          f"layer and compare it with the reference")
    raise SystemExit(0)

y = moe(x, topk_weights, topk_ids)  # humming_gen::fused_moe: routing, GEMM1 + swiglu, GEMM2, top-k sum
error = ((y.double().cpu() - reference).norm() / reference.norm()).item()
print(f"QuantMoE vs float64 reference: relative error {error:.2e} (bound {TOLERANCE})")
assert error < TOLERANCE, f"relative error {error:.3g} against the float64 reference is above {TOLERANCE}"

out = torch.full_like(y, float("nan"))  # poisoned: every row must be written
hg.fused_moe(x, moe, topk_weights, topk_ids, output=out)  # vLLM's fused_experts arguments, into a caller's buffer
assert torch.equal(out, y), "fused_moe(output=...) differs from the layer's output"
print("fused_moe(output=...) equals the layer's output bit for bit")
