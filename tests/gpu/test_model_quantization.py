"""quantize_model on a small randomly initialised Llama-style model (transformers, built from a config: no
download; skipped without transformers): greedy generation of 32 tokens runs, and the logits stay close to the
same model with the dequantized weights in bf16.

Tolerance: relative Frobenius error of the logits below 3e-2, at the prompt and teacher-forced over the generated
sequence (both models run bf16 activations; they differ by the kernels' rounding and accumulation order, carried
through two decoder layers). Tokens are not required to agree: a random model's logits are nearly flat, so the
argmax may flip on a rounding difference.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg

pytestmark = pytest.mark.gpu
TOLERANCE = 3e-2
SCHEMES = ("w4a16-int4-g128", "w4a16-int4-g128-zp", "w8a16-int8-channel")


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                                      tie_word_embeddings=False, initializer_range=0.05)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("preset", SCHEMES)
def test_quantized_llama_generates_close_to_dequantized_bf16(preset):
    model = tiny_llama()
    reference = tiny_llama()  # same seed: the same float weights
    scheme = hg.scheme(preset)
    report = hg.quantize_model(model, scheme, dtype=torch.bfloat16)
    linears = [n for n, m in reference.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    assert sorted(report.quantized) == sorted(linears) and list(report.skipped) == ["lm_head"]
    with torch.no_grad():
        for name in linears:
            w = reference.get_submodule(name).weight
            w.copy_(scheme.quantize(w.detach().float()).dequantize(torch.bfloat16))

    prompt = torch.randint(0, 1024, (2, 12), device="cuda")
    with torch.no_grad():
        assert rel_err(model(prompt).logits, reference(prompt).logits) < TOLERANCE
        generated = model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                   pad_token_id=0)
        assert generated.shape == (2, 12 + 32)
        err = rel_err(model(generated).logits, reference(generated).logits)
    assert err < TOLERANCE, f"{preset}: logits over the generated sequence differ by {err:.3g}"
