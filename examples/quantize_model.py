"""Quantize every linear layer of a model: a small random Llama built from a transformers config (no download;
a two-layer MLP when transformers is not installed).

Without a GPU it builds the layers' kernels for sm_90a and prints which layers were quantized. With a GPU it
also generates 32 tokens greedily, compares the logits with the same model holding the dequantized weights in
bf16, and runs the quantized model under torch.compile.

    python examples/quantize_model.py
"""

from __future__ import annotations

import copy

import torch

import humming_gen as hg

scheme = hg.scheme("w4a16-int4-g128")
gpu = torch.cuda.is_available()
device = "cuda" if gpu else "cpu"

try:
    import transformers

    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device, torch.bfloat16).eval()
except ImportError:
    transformers = None
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 512))
    model = model.to(device, torch.bfloat16).eval()
reference = copy.deepcopy(model)  # before quantizing: the float twin

# Every nn.Linear but lm_head becomes a QuantLinear (kernels compiled in parallel, one set per distinct shape).
build = {} if gpu else dict(target="sm_90a", device="cpu")
report = hg.quantize_model(model, scheme, skip=["lm_head"], dtype=torch.bfloat16, **build)
print(report)
if not gpu:
    print("no GPU here: the layers' kernels are built for sm_90a; run this on a GPU to generate")
    raise SystemExit(0)

# The float twin holds the dequantized weights (the same quantization: it is deterministic).
with torch.no_grad():
    for name in report.quantized:
        w = reference.get_submodule(name).weight
        w.copy_(scheme.quantize(w.detach().float()).dequantize(torch.bfloat16))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


with torch.no_grad():
    if transformers is not None:
        prompt = torch.randint(0, config.vocab_size, (1, 8), device="cuda")
        tokens = model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)
        print(f"generated {tokens.shape[1] - prompt.shape[1]} tokens: {tokens[0, prompt.shape[1]:].tolist()}")
        y, y_ref = model(tokens).logits, reference(tokens).logits
        inner = model.model.layers[0].mlp  # a block without attention masks, for torch.compile below
    else:
        tokens = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
        y, y_ref = model(tokens), reference(tokens)
        inner = model
    print(f"logits vs the dequantized bf16 model: relative error {rel_err(y, y_ref):.2e}")

    # The layers run through the humming_gen::gemm custom op: no graph break, dynamic number of tokens.
    compiled = torch.compile(inner, fullgraph=True, dynamic=True)
    for m in (3, 40):
        h = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        print(f"torch.compile, {m} tokens: max difference to eager {(compiled(h) - inner(h)).abs().max().item():.1e}")
