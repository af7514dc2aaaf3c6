"""quantize_model / load_quantized_model on the CPU (layers built for sm_90a): which modules become QuantLinear,
skip patterns, layers left in float with their reason (or refused with strict=True), and a GPTQ checkpoint
directory read into a fresh model (quantized layers through the converter, float tensors copied, tied and
missing tensors reported)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import humming_gen as hg
from humming_gen.layer import model as model_module
from humming_gen.schemes.converters import gptq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from converter_fixtures import write_checkpoint  # noqa: E402

BUILD = dict(target="sm_90a", device="cpu")


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 256)
        self.block = torch.nn.ModuleDict({"up": torch.nn.Linear(256, 512), "down": torch.nn.Linear(512, 256)})
        self.norm = torch.nn.LayerNorm(256)
        self.lm_head = torch.nn.Linear(256, 64, bias=False)


def toy(seed: int = 0) -> Toy:
    torch.manual_seed(seed)
    return Toy()


def test_linears_are_replaced_except_skipped():
    m = toy()
    report = hg.quantize_model(m, "w4a16-int4-g128", **BUILD)
    assert report.quantized == ["block.up", "block.down"]
    assert report.skipped == {"lm_head": "skip pattern 'lm_head'"}
    assert isinstance(m.block.up, hg.QuantLinear) and isinstance(m.block.down, hg.QuantLinear)
    assert type(m.lm_head) is torch.nn.Linear
    assert m.block.up.bias is not None and m.block.up.in_features == 256 and m.block.up.out_features == 512
    m2 = toy()
    report = hg.quantize_model(m2, "w4a16-int4-g128", skip=["*.down", "lm_head"], **BUILD)
    assert report.quantized == ["block.up"] and set(report.skipped) == {"block.down", "lm_head"}


def test_a_layer_the_scheme_cannot_serve_stays_float_or_is_refused():
    m = toy()
    with torch.no_grad():
        m.block.down.weight[1, 2] = float("nan")
    with pytest.warns(UserWarning, match=r"1 linear layers left in float: block.down: .*weight\[1, 2\] is nan"):
        report = hg.quantize_model(m, "w4a16-int4-g128", skip=None, **BUILD)
    assert report.quantized == ["block.up", "lm_head"] and list(report.skipped) == ["block.down"]
    assert type(m.block.down) is torch.nn.Linear
    assert "block.down" in str(report)
    with pytest.raises(ValueError, match=r"linear layer 'block.down' cannot be quantized: .*is nan"):
        hg.quantize_model(toy_with_nan(), "w4a16-int4-g128", strict=True, **BUILD)


def toy_with_nan() -> Toy:
    m = toy()
    with torch.no_grad():
        m.block.down.weight[1, 2] = float("nan")
    return m


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got str"):
        hg.quantize_model("model", "w4a16-int4-g128", **BUILD)
    with pytest.raises(TypeError, match=r"skip must be a module name pattern .* got an entry 3"):
        hg.quantize_model(toy(), "w4a16-int4-g128", skip=[3], **BUILD)
    with pytest.raises(ValueError, match=r"unknown preset 'w4-nope'"):
        hg.quantize_model(toy(), "w4-nope", **BUILD)


def write_gptq_checkpoint(path: Path, source: Toy) -> dict[str, hg.QuantizedWeight]:
    scheme = hg.QuantScheme("uint4", group_size=128, zero_point="int")
    tensors, qweights, cfg = {}, {}, None
    for name in ("block.up", "block.down"):
        qw = scheme.quantize(source.get_submodule(name).weight.detach())
        if name == "block.down":
            qw.k_perm = torch.randperm(qw.k)  # act-order (desc_act)
        layer_tensors, cfg = gptq.to_checkpoint(qw, name)
        tensors.update(layer_tensors)
        tensors[f"{name}.bias"] = source.get_submodule(name).bias.detach().to(torch.float16)
        qweights[name] = qw
    for key in ("embed.weight", "norm.weight", "norm.bias"):  # lm_head left out: tied / missing
        tensors[key] = source.state_dict()[key].to(torch.bfloat16)
    write_checkpoint(path, tensors, cfg)
    return qweights


def test_load_quantized_checkpoint_into_a_fresh_model(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    source = toy(seed=1)
    written = write_gptq_checkpoint(tmp_path, source)
    built = {}
    original = hg.QuantLinear.from_quantized

    def record(qweight, bias=None, dtype=torch.bfloat16, **kwargs):
        layer = original(qweight, bias=bias, dtype=dtype, **kwargs)
        built[id(layer)] = (qweight, bias)
        return layer

    monkeypatch.setattr(model_module.QuantLinear, "from_quantized", staticmethod(record))
    fresh = toy(seed=2)
    report = hg.load_quantized_model(fresh, tmp_path, **BUILD)
    assert report.quantized == ["block.up", "block.down"] and report.skipped == {}
    assert report.missing == ["lm_head.weight"]
    for name, qw in written.items():
        layer = fresh.get_submodule(name)
        loaded, bias = built[id(layer)]
        assert torch.equal(loaded.dequantize(torch.float64), qw.dequantize(torch.float64)), name
        assert torch.equal(layer.bias, source.get_submodule(name).bias.detach().to(torch.float16).bfloat16())
    assert torch.equal(fresh.embed.weight, source.embed.weight.detach().bfloat16().float())
    assert torch.equal(fresh.norm.bias, source.norm.bias.detach().bfloat16().float())
    # a skipped quantized layer keeps its float module, holding the dequantized weight
    fresh = toy(seed=3)
    report = hg.load_quantized_model(fresh, tmp_path, skip="up", **BUILD)
    assert report.quantized == ["block.down"] and "block.up" in report.skipped
    assert torch.equal(fresh.block.up.weight, written["block.up"].dequantize())


def test_transformers_llama_runs_through_quantized_layers():
    """A tiny random Llama (transformers, no download): every projection but lm_head becomes a QuantLinear, and
    greedy generation runs through their host path (launchers replaced by the float64 product of each layer's
    own quantized weight), matching the model whose float weights are the dequantized ones."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    reference = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    reference.load_state_dict(model.state_dict())
    scheme = hg.scheme("w4a16-int4-g128")
    report = hg.quantize_model(model, scheme, **BUILD)
    assert len(report.quantized) == 7 and list(report.skipped) == ["lm_head"]
    for name in report.quantized:
        w = reference.get_submodule(name).weight
        qw = scheme.quantize(w.detach().float())
        with torch.no_grad():
            w.copy_(qw.dequantize(torch.bfloat16))
        wd = w.detach().double()
        layer = model.get_submodule(name)

        def run(a, c, wd=wd):
            c.copy_((a.double() @ wd.T).to(c.dtype))

        layer._launchers = [(m_max, run) for m_max, _ in layer._launchers]
    prompt = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        assert out.shape == (2, 13)
        torch.testing.assert_close(model(out).logits, reference(out).logits, rtol=2e-2, atol=2e-2)
