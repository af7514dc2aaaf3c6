"""MoE checkpoints -> QuantMoE weights (`humming_gen.load_moe`): small synthetic checkpoints written as safetensors,
read back by prefix, and the dequantized stacked experts compared bit for bit with the source's own dequantization:
transformers' gpt-oss MXFP4 unpacking, compressed-tensors' decompressor (W4A16 per-expert modules), and the FP8
128 x 128 block definition of docs/FORMATS.md 2.3 (DeepSeek). One layer per format is then built for sm_90a on the
CPU (kernels composed and compiled) to check what `to_layer` hands QuantMoE."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from converter_fixtures import ct_compress, write_checkpoint

E, H, I = 3, 384, 128  # 2I != H: swapped weights or biases cannot pass
PREFIX = "model.layers.1.mlp.experts"


# --- gpt-oss MXFP4 ---------------------------------------------------------------------------------------------
def gpt_oss_tensors(prefix: str, original: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    t = {}
    names = (("mlp1_weight", "mlp2_weight", "mlp1_bias", "mlp2_bias", ".") if original else
             ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias", "_"))
    up, down, b13, b2, sep = names
    for name, n, k in ((up, 2 * I, H), (down, H, I)):
        t[f"{prefix}.{name}{sep}blocks"] = torch.randint(0, 256, (E, n, k // 32, 16), dtype=torch.uint8)
        t[f"{prefix}.{name}{sep}scales"] = torch.randint(118, 130, (E, n, k // 32), dtype=torch.uint8)
    t[f"{prefix}.{b13}"] = torch.randn(E, 2 * I).to(torch.bfloat16)
    t[f"{prefix}.{b2}"] = torch.randn(E, H).to(torch.bfloat16)
    return t


@pytest.mark.parametrize("original", [False, True], ids=["transformers-names", "openai-names"])
def test_gpt_oss_matches_transformers(tmp_path, original):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    prefix = "block.1.mlp" if original else PREFIX
    tensors = gpt_oss_tensors(prefix, original)
    write_checkpoint(tmp_path, tensors, {"quant_method": "mxfp4"}, shards=2)
    w = hg.load_moe(tmp_path, prefix)
    assert (w.gate_up_layout, w.activation) == ("interleaved", "swiglu_oai")
    assert w.q13.shape == (E, 2 * I, H) and w.q2.shape == (E, H, I)
    sep = "." if original else "_"
    for q, name in ((w.q13, "mlp1_weight" if original else "gate_up_proj"),
                    (w.q2, "mlp2_weight" if original else "down_proj")):
        ref = convert_moe_packed_tensors(tensors[f"{prefix}.{name}{sep}blocks"],
                                         tensors[f"{prefix}.{name}{sep}scales"], dtype=torch.bfloat16)  # (E, K, N)
        assert torch.equal(q.dequantize(torch.bfloat16).transpose(1, 2), ref), name
    b13, b2 = ("mlp1_bias", "mlp2_bias") if original else ("gate_up_proj_bias", "down_proj_bias")
    assert torch.equal(w.bias13, tensors[f"{prefix}.{b13}"]) and torch.equal(w.bias2, tensors[f"{prefix}.{b2}"])


def test_gpt_oss_layer_reads_interleaved_rows_with_swiglu(tmp_path):
    write_checkpoint(tmp_path, gpt_oss_tensors(PREFIX), {"quant_method": "mxfp4"})
    moe = hg.QuantMoE.from_checkpoint(tmp_path, PREFIX, target="sm_90a", device="cpu")
    assert (moe.activation, moe.gate_up_layout) == ("swiglu_oai", "interleaved")
    assert moe.bias13.shape == (E, 2 * I) and moe.bias2.shape == (E, H) and moe.bias13.dtype == torch.bfloat16
    assert (moe.num_experts, moe.hidden, moe.intermediate) == (E, H, I)


# --- compressed-tensors W4A16, per-expert modules --------------------------------------------------------------
@pytest.mark.parametrize("names", [("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")],
                         ids=["deepseek-qwen-names", "mixtral-names"])
def test_compressed_tensors_w4a16_moe_matches_library(tmp_path, names):
    pytest.importorskip("compressed_tensors")
    torch.manual_seed(1)
    tensors, refs = {}, {}
    cfg = None
    for e in range(E):
        for name, n, k in ((names[0], I, H), (names[1], I, H), (names[2], H, I)):
            state, cfg, ref = ct_compress(torch.randn(n, k, dtype=torch.bfloat16) * 0.1, "W4A16")
            tensors.update({f"{PREFIX}.{e}.{name}.{key}": v for key, v in state.items()})
            refs[e, name] = ref
    write_checkpoint(tmp_path, tensors, cfg, shards=3)
    w = hg.load_moe(tmp_path, PREFIX)
    assert (w.gate_up_layout, w.activation, w.bias13, w.bias2) == ("split", "silu_mul", None, None)
    expected13 = torch.stack([torch.cat([refs[e, names[0]], refs[e, names[1]]]) for e in range(E)])
    expected2 = torch.stack([refs[e, names[2]] for e in range(E)])
    assert torch.equal(w.q13.dequantize(torch.bfloat16), expected13)
    assert torch.equal(w.q2.dequantize(torch.bfloat16), expected2)
    assert w.q13.scheme.activation is None


# --- DeepSeek FP8 128 x 128 blocks --------------------------------------------------------------------------------
def fp8_block_dequant(codes: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """docs/FORMATS.md 2.3: W[n, k] = q[n, k] * s[n // 128, k // 128] (partial edge blocks hold the real elements)."""
    n, k = codes.shape
    s = scale_inv.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return codes.to(torch.float64) * s.to(torch.float64)


def test_deepseek_fp8_block_moe_matches_definition(tmp_path):
    torch.manual_seed(2)
    hidden, inter = 320, 256  # hidden: a partial 64-wide edge block along both K (w13) and N (w2)
    tensors, refs = {}, {}
    for e in range(E):
        for name, n, k in (("gate_proj", inter, hidden), ("up_proj", inter, hidden), ("down_proj", hidden, inter)):
            codes = (torch.randn(n, k) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            scale = torch.rand(-(-n // 128), -(-k // 128)) * 1e-3 + 1e-4
            tensors[f"{PREFIX}.{e}.{name}.weight"] = codes
            tensors[f"{PREFIX}.{e}.{name}.weight_scale_inv"] = scale
            refs[e, name] = fp8_block_dequant(codes, scale)
    cfg = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    write_checkpoint(tmp_path, tensors, cfg)
    w = hg.load_moe(tmp_path, PREFIX)
    assert w.q13.scheme.block_size == (128, 128) and w.q13.scheme.activation is not None  # as the checkpoint says
    expected13 = torch.stack([torch.cat([refs[e, "gate_proj"], refs[e, "up_proj"]]) for e in range(E)])
    expected2 = torch.stack([refs[e, "down_proj"] for e in range(E)])
    assert torch.equal(w.q13.dequantize(torch.float64), expected13)
    assert torch.equal(w.q2.dequantize(torch.float64), expected2)
    # to_layer runs these experts weight-only (W8A16); as converted (fp8 activations per 1 x 128 group) they need
    # K = hidden a multiple of 128 (tests/cpu/test_moe_gemm_a8.py builds such layers)
    only = w.weight_only()
    assert only.q13.scheme.activation is None and only.q2.scheme.activation is None
    assert torch.equal(only.q13.dequantize(torch.float64), expected13)
    with pytest.raises(ValueError, match="k=320 is not a multiple of the activation scheme's group_size=128"):
        hg.QuantMoE.from_quantized(w.q13, w.q2, target="sm_90a", device="cpu", strict=True)
    fallback = hg.QuantMoE.from_quantized(w.q13, w.q2, target="sm_90a", device="cpu")  # no 1 x 128 tiling of K
    assert fallback.compute_dtypes == ("bfloat16", "float8e4m3")  # w2's K = 256 keeps its fp8 activations
    moe = w.to_layer(target="sm_90a", device="cpu")
    assert (moe.num_experts, moe.hidden, moe.intermediate, moe.activation) == (E, hidden, inter, "silu_mul")


def test_per_expert_biases_are_stacked():
    from humming_gen.schemes.converters.moe import convert_moe

    torch.manual_seed(3)
    scheme = hg.QuantScheme("float8e4m3", block_size=(128, 128), scale_dtype="float32")
    tensors = {}
    for e in range(2):
        for name, n, k in (("gate_proj", 128, 128), ("up_proj", 128, 128), ("down_proj", 128, 128)):
            q = scheme.quantize(torch.randn(n, k))
            tensors[f"x.{e}.{name}.weight"] = q.codes.to(torch.uint8).view(torch.float8_e4m3fn)
            tensors[f"x.{e}.{name}.weight_scale_inv"] = q.scales
            tensors[f"x.{e}.{name}.bias"] = torch.full((n,), float(10 * e + len(name)))
    cfg = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    w = convert_moe(tensors, cfg, "x")
    assert torch.equal(w.bias13[1], torch.cat([tensors["x.1.gate_proj.bias"], tensors["x.1.up_proj.bias"]]))
    assert torch.equal(w.bias2, torch.stack([tensors["x.0.down_proj.bias"], tensors["x.1.down_proj.bias"]]))
    del tensors["x.1.up_proj.bias"]
    with pytest.raises(ValueError, match=r"\['x.1.up_proj.bias'\] are missing"):
        convert_moe(tensors, cfg, "x")


def test_unknown_layout_is_refused_naming_the_prefix(tmp_path):
    write_checkpoint(tmp_path, {"model.layers.0.mlp.gate.weight": torch.zeros(4, 8)}, {"quant_method": "mxfp4"})
    with pytest.raises(ValueError, match=r"no MoE experts under prefix 'model.layers.0.mlp.experts': looked for"):
        hg.load_moe(tmp_path, "model.layers.0.mlp.experts")
