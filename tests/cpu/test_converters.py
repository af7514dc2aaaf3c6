"""Converters from the published layouts (docs/FORMATS.md section 3), loading, stacking, fusing, errors and the round
trip of humming_gen's own quantization through every exporter.

Fixtures here are written from the layout descriptions, independently of the converters' bit helpers (python
integer bit strings, the packing loops of AutoGPTQ / AutoAWQ reproduced, ml_dtypes for element values), so they
need no producer library; test_converters_oracles.py checks the same formats against the libraries themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import ml_dtypes
import numpy as np
import pytest
import torch

from converter_fixtures import assert_same, write_checkpoint
from humming_gen.schemes.checkpoint import SafetensorsCheckpoint
from humming_gen.schemes.converters import (
    awq, bitnet, bits, compressed_tensors, convert, detect_format, fp8, gptq, load_layer, modelopt, mxfp4)
from humming_gen.schemes.converters.common import reciprocal
from humming_gen.schemes.scheme import ActivationScheme, QuantizedWeight, QuantScheme


def _fp4(codes: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(codes.numpy().astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64))


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64))


def _bitstring_words(codes: list[int], b: int) -> list[int]:
    """LSB-first dense bit string of `codes` split into unsigned 32-bit words (python big ints)."""
    acc = sum(c << (i * b) for i, c in enumerate(codes))
    return [(acc >> (32 * w)) & 0xFFFFFFFF for w in range(math.ceil(len(codes) * b / 32))]


def _i32(words) -> torch.Tensor:
    return torch.tensor(np.array(words, dtype=np.uint32).view(np.int32))


# --- bits ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b", range(1, 9))
def test_bits_pack_matches_bitstring(b):
    torch.manual_seed(b)
    codes = torch.randint(0, 1 << b, (3, 64))
    words = _i32([_bitstring_words(row.tolist(), b) for row in codes])
    assert torch.equal(bits.pack(codes, b), words)
    assert torch.equal(bits.unpack(words, b, 64).to(torch.int64), codes)
    assert torch.equal(bits.unpack(words.T.contiguous(), b, 64, dim=0).T.to(torch.int64), codes)


@pytest.mark.parametrize("b", range(1, 9))
@pytest.mark.parametrize("word", [torch.uint8, torch.int8, torch.int32], ids=["uint8", "int8", "int32"])
def test_bits_unpack_of_every_word_type_and_a_partial_last_word(b, word):
    """unpack's two paths (fields that never straddle a word, shifted out in the word's width; the general int64
    path) against the bit string, with a count that ends inside the last word."""
    torch.manual_seed(b)
    count = 61
    codes = torch.randint(0, 1 << b, (3, count))
    wb = 8 if word != torch.int32 else 32
    acc = [sum(c << (i * b) for i, c in enumerate(row.tolist())) for row in codes]
    n_words = math.ceil(count * b / wb)
    unsigned = np.array([[(a >> (wb * w)) & ((1 << wb) - 1) for w in range(n_words)] for a in acc],
                        dtype=np.uint8 if wb == 8 else np.uint32)
    words = torch.from_numpy(unsigned.view({torch.uint8: np.uint8, torch.int8: np.int8, torch.int32: np.int32}[word]))
    assert torch.equal(bits.unpack(words, b, count).to(torch.int64), codes)
    assert torch.equal(bits.unpack(words.T.contiguous(), b, count, dim=0).T.to(torch.int64), codes)
    with pytest.raises(ValueError, match="cannot hold"):
        bits.unpack(words, b, n_words * wb // b + 1)


def test_autogptq_3bit_loop_matches_bits_pack():
    """AutoGPTQ's explicit 3-bit packer (qlinear_cuda_old.pack, reproduced): 10 codes, a straddling code,
    10 codes, a straddling code, 10 codes per 3 words; codes 10 and 21 straddle."""
    torch.manual_seed(0)
    q = np.random.randint(0, 8, (64, 5)).astype(np.uint32)  # (K, N)
    out = np.zeros((64 * 3 // 32, 5), dtype=np.uint32)
    i = row = 0
    while row < out.shape[0]:
        for j in range(i, i + 10):
            out[row] |= q[j] << (3 * (j - i))
        i += 10
        out[row] |= q[i] << 30
        row += 1
        out[row] |= (q[i] >> 2) & 1
        i += 1
        for j in range(i, i + 10):
            out[row] |= q[j] << (3 * (j - i) + 1)
        i += 10
        out[row] |= q[i] << 31
        row += 1
        out[row] |= (q[i] >> 1) & 0x3
        i += 1
        for j in range(i, i + 10):
            out[row] |= q[j] << (3 * (j - i) + 2)
        i += 10
        row += 1
    assert torch.equal(bits.pack(torch.from_numpy(q.astype(np.int64)), 3, dim=0), torch.from_numpy(out.view(np.int32)))


@pytest.mark.parametrize("b,words", [(4, [0x77777777]), (8, [0x7F7F7F7F]), (2, [0x55555555]),
                                     (3, [0xDB6DB6DB, 0xB6DB6DB6, 0x6DB6DB6D])])
def test_gptq_sym_v1_zero_words(b, words):
    """Published constants: a symmetric v1 checkpoint stores 2^(b-1) - 1 in every qzeros field."""
    n = 32 * len(words) // b  # one qzeros row of len(words) words
    qw = QuantizedWeight(QuantScheme(f"int{b}", group_size=32, scale_dtype="float16"),
                         torch.zeros(n, 32, dtype=torch.uint8), torch.ones(n, 1))
    tensors, _ = gptq.to_checkpoint(qw, checkpoint_format="gptq")
    assert tensors["qzeros"].numpy().view(np.uint32).tolist() == [words]


# --- GPTQ from the layout --------------------------------------------------------------------------------------
@pytest.mark.parametrize("b", [2, 3, 4, 8])
@pytest.mark.parametrize("sym,fmt", [(True, "gptq"), (False, "gptq"), (False, "gptq_v2")])
def test_gptq_layout(b, sym, fmt):
    """qweight: per column n, the K codes as one LSB-first bit string; qzeros the same along N; v1 adds 1."""
    torch.manual_seed(b)
    n, k, g = 32, 64, 32
    q = torch.randint(0, 1 << b, (k, n))
    stored_z = torch.randint(0, (1 << b) - 1, (k // g, n))
    scales = (torch.rand(k // g, n) + 0.5).half()
    tensors = {"qweight": _i32([[*_bitstring_words(q[:, c].tolist(), b)] for c in range(n)]).T.contiguous(),
               "qzeros": _i32([_bitstring_words(r.tolist(), b) for r in stored_z]), "scales": scales}
    qw = convert(tensors, {"quant_method": "gptq", "bits": b, "group_size": g, "sym": sym, "checkpoint_format": fmt})
    z = 2 ** (b - 1) if sym else stored_z.double() + (1 if fmt == "gptq" else 0)
    zk = z if sym else z.repeat_interleave(g, 0)
    expected = (scales.double().repeat_interleave(g, 0) * (q.double() - zk)).T
    assert torch.equal(qw.dequantize(torch.float64), expected)
    assert qw.scheme.weight.name == (f"int{b}" if sym else f"uint{b}")


def test_gptq_act_order_and_channel():
    """desc_act: g_idx = invperm // g, qweight rows in original K order; k_perm sorts K by group."""
    torch.manual_seed(1)
    n, k, g = 16, 96, 32
    q = torch.randint(0, 16, (k, n))
    g_idx = (torch.randperm(k).argsort() // g).int()
    scales = (torch.rand(k // g, n) + 0.5).half()
    tensors = {"l.qweight": bits.pack(q, 4, dim=0), "l.qzeros": bits.pack(torch.full((k // g, n), 7), 4, dim=1),
               "l.scales": scales, "l.g_idx": g_idx}
    qw = convert(tensors, {"quant_method": "gptq", "bits": 4, "group_size": g, "desc_act": True}, "l")
    assert torch.equal(g_idx[qw.k_perm.long()].long(), torch.arange(k) // g)
    expected = (scales.double()[g_idx.long()] * (q.double() - 8)).T
    assert torch.equal(qw.dequantize(torch.float64), expected)
    ch = convert({"qweight": bits.pack(q, 4, dim=0), "scales": scales[:1], "qzeros": tensors["l.qzeros"][:1]},
                 {"quant_method": "gptq", "bits": 4, "group_size": -1})
    assert ch.scheme.granularity == "channel" and ch.scales.shape == (n, 1)


# --- AWQ from the layout ---------------------------------------------------------------------------------------
def _awq_pack(intweight: torch.Tensor) -> torch.Tensor:
    """AutoAWQ WQLinear_GEMM.from_linear's packing loop, reproduced: (rows, N) -> (rows, N/8)."""
    out = torch.zeros(intweight.shape[0], intweight.shape[1] // 8, dtype=torch.int32)
    for col in range(intweight.shape[1] // 8):
        for i, order in enumerate([0, 2, 4, 6, 1, 3, 5, 7]):
            out[:, col] |= intweight[:, col * 8 + order].to(torch.int32) << (i * 4)
    return out


def test_awq_layout():
    torch.manual_seed(0)
    k, n, g = 64, 32, 32
    q, z = torch.randint(0, 16, (k, n)), torch.randint(0, 16, (k // g, n))
    scales = (torch.rand(k // g, n) + 0.1).half()
    qw = convert({"qweight": _awq_pack(q), "qzeros": _awq_pack(z), "scales": scales},
                 {"quant_method": "awq", "w_bit": 4, "q_group_size": g, "version": "GEMM"})
    expected = (scales.double().repeat_interleave(g, 0) * (q - z.repeat_interleave(g, 0)).double()).T
    assert torch.equal(qw.dequantize(torch.float64), expected)


# --- BitNet, gpt-oss, ModelOpt, FP8 from the layout ---------------------------------------------------------
def test_bitnet_published_example():
    """transformers' unpack_weights docstring example: bit pair i of byte row r is row i*N/4 + r, value t + 1."""
    packed = torch.tensor([[0b10100001, 0b00011000], [0b10010000, 0b00001010]], dtype=torch.uint8)
    qw = convert({"weight": packed, "weight_scale": torch.tensor([1.0])}, {"quant_method": "bitnet"})
    expected = [[0, -1], [-1, 1], [-1, 1], [-1, 1], [1, 0], [0, -1], [1, -1], [1, -1]]
    assert qw.dequantize().tolist() == expected
    assert qw.scheme.weight.name == "int2" and qw.scheme.activation.dtype.name == "int8"


def test_gpt_oss_layout():
    """Byte j of block kb: element 32*kb + 2j in the low nibble, + 1 in the high nibble; scale 2^(c - 127)."""
    torch.manual_seed(0)
    e, n, k = 2, 8, 64
    codes = torch.randint(0, 16, (e, n, k), dtype=torch.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(e, n, k // 32, 16)
    scales = torch.randint(120, 135, (e, n, k // 32), dtype=torch.uint8)
    qw = convert({"m.experts.down_proj_blocks": blocks, "m.experts.down_proj_scales": scales},
                 {"quant_method": "mxfp4"}, "m.experts.down_proj")
    expected = _fp4(codes) * torch.exp2(scales.double() - 127).repeat_interleave(32, -1)
    assert torch.equal(qw.dequantize(torch.float64), expected)
    openai = convert({"block.0.mlp.mlp2_weight.blocks": blocks, "block.0.mlp.mlp2_weight.scales": scales}, {},
                     "block.0.mlp.mlp2_weight", format="mxfp4")
    assert_same(openai, qw)


def test_modelopt_nvfp4_layout():
    torch.manual_seed(0)
    n, k = 16, 64
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    sb = torch.rand(n, k // 16).mul(8).to(torch.float8_e4m3fn)
    tensors = {"l.weight": codes[:, 0::2] | (codes[:, 1::2] << 4), "l.weight_scale": sb,
               "l.weight_scale_2": torch.tensor(0.0123), "l.input_scale": torch.tensor(0.25)}
    qw = convert(tensors, {"quant_method": "modelopt", "quant_algo": "NVFP4"}, "l")
    expected = _fp4(codes) * _e4m3(sb).repeat_interleave(16, -1) * torch.tensor(0.0123).double()
    assert torch.equal(qw.dequantize(torch.float64), expected)
    assert qw.input_scale.item() == 0.25 and qw.scheme.activation.global_scale


def test_fp8_tensor_and_block_layout():
    torch.manual_seed(0)
    w = torch.randn(200, 300).to(torch.float8_e4m3fn)
    qw = convert({"weight": w, "weight_scale": torch.tensor(0.5), "input_scale": torch.tensor(0.125)},
                 {"quant_method": "fp8", "activation_scheme": "static"})
    assert torch.equal(qw.dequantize(torch.float64), w.double() * 0.5)
    assert qw.input_scale.item() == 0.125 and qw.scheme.activation.granularity == "tensor"
    s = torch.rand(2, 3) + 0.5  # (ceil(200/128), ceil(300/128)): partial edge blocks
    qb = convert({"weight": w, "weight_scale_inv": s},
                 {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"})
    rows, cols = torch.arange(200) // 128, torch.arange(300) // 128
    assert torch.equal(qb.dequantize(torch.float64), w.double() * s.double()[rows][:, cols])


def test_ct_mxfp4_e8m0_code_zero():
    """e8m0 code 0 is 2^-127 (a float32 subnormal), not 0."""
    qw = convert({"weight_packed": torch.full((1, 16), 0x22, dtype=torch.uint8),
                  "weight_scale": torch.zeros(1, 1, dtype=torch.uint8)},
                 {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "config_groups": {
                     "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 32,
                                                               "strategy": "group"}}}})
    assert qw.scales.item() == 2.0 ** -127 and qw.dequantize()[0, 0].item() == 2.0 ** -127


def test_gpt_oss_e8m0_code_255_is_refused_as_nan():
    """A scale byte 255 is NaN (OCP MX), not 2^128: the checkpoint is refused naming the NaN scale."""
    scales = torch.full((1, 2, 1), 127, dtype=torch.uint8)
    scales[0, 1, 0] = 255
    with pytest.raises(ValueError, match=r"QuantizedWeight.scales\[0, 1, 0\] is nan"):
        convert({"m.experts.down_proj_blocks": torch.zeros(1, 2, 1, 16, dtype=torch.uint8),
                 "m.experts.down_proj_scales": scales}, {"quant_method": "mxfp4"}, "m.experts.down_proj")


# --- loading ---------------------------------------------------------------------------------------------------
def _ct_int4(qw_by_name: dict[str, QuantizedWeight]) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, cfg = {}, None
    for name, qw in qw_by_name.items():
        t, cfg = compressed_tensors.to_checkpoint(qw, name)
        tensors.update(t)
    return tensors, cfg


class _Recording(Mapping):
    """A checkpoint mapping that records which tensors were read."""

    def __init__(self, source: SafetensorsCheckpoint):
        self.source, self.read = source, []

    def __getitem__(self, name):
        self.read.append(name)
        return self.source[name]

    def __contains__(self, name):
        return name in self.source

    def __iter__(self):
        return iter(self.source)

    def __len__(self):
        return len(self.source)


def test_load_layer_lazy_sharded(tmp_path):
    scheme = QuantScheme("int4", group_size=32, scale_dtype="bfloat16")
    torch.manual_seed(0)
    layers = {f"model.layers.{i}.mlp.down_proj": scheme.quantize(torch.randn(32, 64)) for i in range(3)}
    tensors, cfg = _ct_int4(layers)
    write_checkpoint(tmp_path, tensors, cfg, shards=3)
    source = SafetensorsCheckpoint(tmp_path)
    recording = _Recording(source)
    qw = convert(recording, cfg, "model.layers.1.mlp.down_proj")
    assert_same(qw, layers["model.layers.1.mlp.down_proj"])
    assert recording.read and all(r.startswith("model.layers.1.") for r in recording.read)


def test_stacked_experts_and_fused(tmp_path):
    torch.manual_seed(0)
    scheme = QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True)
    parts = {f"m.experts.{i}.{p}": scheme.quantize(torch.randn(32, 64) * (i + 1))
             for i in range(3) for p in ("gate_proj", "up_proj")}
    tensors, cfg = {}, None
    for name, qw in parts.items():
        qw.input_scale = torch.tensor(0.1 * len(name))
        t, cfg = modelopt.to_checkpoint(qw, name)
        tensors.update(t)
    write_checkpoint(tmp_path, tensors, cfg, config_name="hf_quant_config.json")
    gate = load_layer(tmp_path, "m.experts.*.gate_proj")
    assert gate.shape == (3, 32, 64) and gate.global_scale.shape == (3,)
    for i in range(3):
        assert torch.equal(gate.dequantize()[i], parts[f"m.experts.{i}.gate_proj"].dequantize())
    fused = load_layer(tmp_path, ["m.experts.*.gate_proj", "m.experts.*.up_proj"])
    assert fused.shape == (3, 64, 64) and fused.channel_scale.shape == (3, 64)
    expected = torch.cat([gate.dequantize(), load_layer(tmp_path, "m.experts.*.up_proj").dequantize()], dim=1)
    assert torch.equal(fused.dequantize(), expected)
    assert torch.equal(fused.input_scale, torch.stack([p.input_scale for p in parts.values()]).max())
    with pytest.raises(ValueError, match="expert indices \\[1\\] are missing"):
        convert({k: v for k, v in tensors.items() if ".1." not in k}, cfg, "m.experts.*.gate_proj")


def test_fused_fp8_per_tensor_scales(tmp_path):
    """q/k/v with one scale each: kept per row in channel_scale, input_scale = max over shards."""
    torch.manual_seed(0)
    tensors = {}
    for i, p in enumerate(("q_proj", "k_proj", "v_proj")):
        tensors[f"attn.{p}.weight"] = torch.randn(16 * (i + 1), 32).to(torch.float8_e4m3fn)
        tensors[f"attn.{p}.weight_scale"] = torch.tensor(0.5 + i)
        tensors[f"attn.{p}.input_scale"] = torch.tensor(1.0 + (i % 2))
    write_checkpoint(tmp_path, tensors, {"quant_method": "fp8", "activation_scheme": "static"})
    names = [f"attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    fused = load_layer(tmp_path, names)
    assert fused.shape == (96, 32) and fused.input_scale.item() == 2.0 and fused.channel_scale.shape == (96,)
    assert torch.equal(fused.dequantize(), torch.cat([load_layer(tmp_path, n).dequantize() for n in names]))


def test_config_files(tmp_path):
    """quantize_config.json (legacy GPTQ) and hf_quant_config.json (ModelOpt) are found; config.json wins."""
    qw = QuantScheme("int4", group_size=32, scale_dtype="float16").quantize(torch.randn(32, 64))
    t, cfg = gptq.to_checkpoint(qw, "l")
    cfg.pop("quant_method")
    write_checkpoint(tmp_path / "legacy", t, cfg, config_name="quantize_config.json")
    assert_same(load_layer(tmp_path / "legacy", "l"), qw)
    write_checkpoint(tmp_path / "none", t, None)
    with pytest.raises(ValueError, match="no quantization config"):
        load_layer(tmp_path / "none", "l")
    assert detect_format({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}) == "modelopt"


# --- errors ----------------------------------------------------------------------------------------------------
def _gptq_tensors(k=64, n=32, g=32):
    return {"l.qweight": torch.zeros(k * 4 // 32, n, dtype=torch.int32), "l.scales": torch.ones(k // g, n).half(),
            "l.qzeros": torch.zeros(k // g, n // 8, dtype=torch.int32)}


def test_errors():
    cfg = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    t = _gptq_tensors()
    with pytest.raises(ValueError, match="'l.scales' is missing"):
        convert({k: v for k, v in t.items() if k != "l.scales"}, cfg, "l")
    with pytest.raises(ValueError, match="group size not matching K"):
        convert(t, {**cfg, "group_size": 16}, "l")
    with pytest.raises(ValueError, match="pack_dtype"):
        convert(t, {**cfg, "pack_dtype": "int16"}, "l")
    with pytest.raises(ValueError, match="gptq_p"):
        convert(t, {**cfg, "format": "gptq_p"}, "l")
    with pytest.raises(ValueError, match="unknown quant_method 'foo'"):
        convert(t, {"quant_method": "foo"}, "l")
    with pytest.raises(ValueError, match="unknown format 'bar'"):
        convert(t, cfg, "l", format="bar")
    with pytest.raises(ValueError, match="'l.weight_scale' has shape \\(8, 2\\), expected \\(8, 1\\)"):
        convert({"l.weight": torch.zeros(8, 16, dtype=torch.uint8),
                 "l.weight_scale": torch.zeros(8, 2, dtype=torch.uint8)}, {"quant_method": "mxfp4"}, "l")
    with pytest.raises(ValueError, match="holds the 2-bit value 3"):
        convert({"weight": torch.full((2, 4), 0xFF, dtype=torch.uint8), "weight_scale": torch.ones(1)},
                {"quant_method": "bitnet"})


def test_ct_errors():
    qw = QuantScheme("int4", group_size=32, scale_dtype="bfloat16").quantize(torch.randn(32, 64))
    t, cfg = compressed_tensors.to_checkpoint(qw, "model.layers.0.mlp.up_proj")
    bad_shape = {**t, "model.layers.0.mlp.up_proj.weight_shape": torch.tensor([32, 96])}
    with pytest.raises(ValueError, match="weight_packed' has shape \\(32, 8\\), expected \\(32, 12\\)"):
        convert(bad_shape, cfg, "model.layers.0.mlp.up_proj")
    group = cfg["config_groups"]["group_0"]
    with pytest.raises(ValueError, match="strategy 'attn_head'"):
        convert(t, {**cfg, "config_groups": {"g": {**group, "weights": {**group["weights"], "strategy": "attn_head"}}}},
                "model.layers.0.mlp.up_proj")
    with pytest.raises(ValueError, match="ignore"):
        convert(t, {**cfg, "ignore": ["re:.*up_proj"]}, "model.layers.0.mlp.up_proj")
    with pytest.raises(ValueError, match="group size not matching K"):
        convert(t, {**cfg, "config_groups": {"g": {**group, "weights": {**group["weights"], "group_size": 16}}}},
                "model.layers.0.mlp.up_proj")
    with pytest.raises(ValueError, match="format 'sparse-bitmask'"):
        convert(t, {**cfg, "format": "sparse-bitmask", "config_groups": {"g": {**group, "format": None}}},
                "model.layers.0.mlp.up_proj")


# --- round trip ------------------------------------------------------------------------------------------------
_FP8_T = ActivationScheme("float8e4m3", granularity="tensor")
ROUND_TRIP = [
    (gptq, QuantScheme("int4", group_size=32, scale_dtype="float16"), {}),
    (gptq, QuantScheme("int3", group_size=64, scale_dtype="bfloat16"), {"checkpoint_format": "gptq"}),
    (gptq, QuantScheme("uint2", group_size=32, scale_dtype="float16", zero_point="int"), {}),
    (gptq, QuantScheme("uint8", granularity="channel", scale_dtype="float32", zero_point="int"), {}),
    (awq, QuantScheme("uint4", group_size=32, scale_dtype="float16", zero_point="int"), {}),
    (compressed_tensors, QuantScheme("int4", group_size=32, scale_dtype="bfloat16"), {}),
    (compressed_tensors, QuantScheme("uint3", granularity="channel", scale_dtype="float16", zero_point="int"), {}),
    (compressed_tensors, QuantScheme("int8", granularity="channel", scale_dtype="float32",
                                     activation=ActivationScheme("int8", granularity="token")), {}),
    (compressed_tensors, QuantScheme("float8e4m3", block_size=(32, 32), scale_dtype="float32"), {}),
    (compressed_tensors, QuantScheme("float8e4m3", granularity="tensor", scale_dtype="float32", activation=_FP8_T),
     {"input_scale": 0.75}),
    (compressed_tensors, QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0", scale_rule="even"), {}),
    (compressed_tensors, QuantScheme("float8e4m3", group_size=32, scale_dtype="float8e8m0", scale_rule="even"), {}),
    (compressed_tensors, QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True), {}),
    (fp8, QuantScheme("float8e4m3", granularity="tensor", scale_dtype="float32", activation=_FP8_T),
     {"input_scale": 0.5}),
    (fp8, QuantScheme("float8e4m3", block_size=(32, 32), scale_dtype="float32", activation=ActivationScheme(
        "float8e4m3", granularity="group", group_size=32)), {}),
    (mxfp4, QuantScheme("float4e2m1", group_size=32, scale_dtype="float8e8m0"), {"experts": 2}),
    (modelopt, QuantScheme("float4e2m1", group_size=16, scale_dtype="float8e4m3", global_scale=True), {}),
    (modelopt, QuantScheme("float8e4m3", granularity="tensor", scale_dtype="float32", activation=_FP8_T),
     {"input_scale": 2.0}),
    (bitnet, QuantScheme("int2", granularity="tensor", scale_dtype="float32",
                         activation=ActivationScheme("int8", granularity="token")), {}),
]


@pytest.mark.parametrize("module,scheme,options", ROUND_TRIP,
                         ids=[f"{m.__name__.rsplit('.', 1)[-1]}-{s.weight.name}-{s.granularity}" for m, s, _ in
                              ROUND_TRIP])
def test_round_trip(tmp_path, module, scheme, options):
    """QuantScheme.quantize -> to_checkpoint -> safetensors -> load_layer gives the identical QuantizedWeight.
    Formats that store a divisor (CT global scale, BitNet weight_scale) return float32(1/float32(1/x))."""
    options = dict(options)
    torch.manual_seed(0)
    experts = options.pop("experts", None)
    shape = (experts, 64, 128) if experts else (64, 128)
    qw = scheme.quantize(torch.randn(*shape))
    if "input_scale" in options:
        qw.input_scale = torch.tensor(options.pop("input_scale"))
    if module in (gptq, compressed_tensors) and scheme.weight.is_int and scheme.granularity == "group":
        # act-order; g_idx keeps only the group of each channel, so within a group channels come back ascending
        qw.k_perm = torch.argsort(torch.randperm(qw.k) // scheme.group_size, stable=True)
    if module is gptq and options.get("checkpoint_format") == "gptq" and qw.zero_points is not None:
        qw.zero_points.clamp_(min=1)
    prefix = "model.layers.3.mlp.experts.down_proj" if experts else "model.layers.3.mlp.down_proj"
    tensors, cfg = module.to_checkpoint(qw, prefix, **options)
    config_name = "hf_quant_config.json" if module is modelopt else "config.json"
    write_checkpoint(tmp_path, tensors, cfg, config_name=config_name)
    back = load_layer(tmp_path, prefix)
    if module is compressed_tensors and scheme.global_scale:
        qw.global_scale = reciprocal(reciprocal(qw.global_scale))
    if module is bitnet:
        qw.scales = reciprocal(reciprocal(qw.scales))
    assert_same(back, qw)
