"""Converters against the libraries that define the formats: checkpoints are produced by the library, saved to
safetensors, read back with `load_layer`, and the dequantized weight must equal the library's own
dequantization bit for bit.

compressed-tensors and transformers are test requirements (tests/requirements-test.txt). AutoGPTQ, AutoAWQ,
ModelOpt and torchao are optional heavy oracles (their packages pull datasets/peft/CUDA extras): those tests
skip when the package is absent, and the same formats are covered from their published layouts in
test_converters.py.
"""

from __future__ import annotations

import pytest
import torch

from converter_fixtures import ct_compress, load_file_module, oracle_missing, write_checkpoint
from humming_gen.schemes.converters import bits, load_layer

pytest.importorskip("compressed_tensors")  # listed in tests/requirements-test.txt; import guard only


# --- compressed-tensors ------------------------------------------------------------------------------------
CT_CASES = [
    ("W4A16", {}), ("W4A16_ASYM", {}), ("W4A16", dict(strategy="channel", group_size=None)),
    ("W4A16_ASYM", dict(strategy="channel", group_size=None)), ("W3A16", dict(group_size=64)),
    ("W2A16", dict(group_size=32)), ("W5A16", dict(symmetric=False)), ("W8A16", {}), ("W8A8", {}),
    ("FP8", {}), ("FP8_DYNAMIC", {}), ("FP8_BLOCK", {}), ("NVFP4", {}), ("NVFP4A16", {}), ("MXFP4", {}),
    ("MXFP8", {}),
]


@pytest.mark.parametrize("preset,overrides", CT_CASES, ids=[f"{p}-{'-'.join(map(str, o.values()))}".rstrip("-")
                                                            for p, o in CT_CASES])
def test_compressed_tensors_matches_library(tmp_path, preset, overrides):
    torch.manual_seed(0)
    w = torch.randn(256, 256, dtype=torch.bfloat16)
    state, cfg, reference = ct_compress(w, preset, **overrides)
    prefix = "model.layers.0.mlp.down_proj"
    write_checkpoint(tmp_path, {f"{prefix}.{k}": v for k, v in state.items()}, cfg, shards=2)
    qw = load_layer(tmp_path, prefix)
    assert torch.equal(qw.dequantize(reference.dtype), reference)


def test_ct_pack_to_int32_is_bits_pack():
    """bits.pack / bits.unpack equal compressed-tensors' pack_to_int32 / unpack_from_int32 for 1..8 bits,
    along both axes (weights along K, zero points along N), K not a multiple of 32/b included."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    torch.manual_seed(0)
    for b in range(1, 9):
        q = torch.randint(-(1 << (b - 1)), 1 << (b - 1), (40, 75), dtype=torch.int8)
        for dim in (1, 0):
            ref = pack_to_int32(q, b, packed_dim=dim)
            ours = bits.pack((q.to(torch.int64) + (1 << (b - 1))), b, dim=dim)
            assert torch.equal(ours, ref), (b, dim)
            back = unpack_from_int32(ref, b, q.shape, packed_dim=dim)
            assert torch.equal(bits.unpack(ref, b, q.shape[dim], dim=dim).to(torch.int64) - (1 << (b - 1)),
                               back.to(torch.int64)), (b, dim)


def test_ct_nvfp4_helpers_nibble_order():
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8

    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]).repeat(4, 2)
    packed = pack_fp4_to_uint8(values)
    codes = bits.unpack_nibbles(packed)
    assert torch.equal(codes[0, :16], torch.arange(16, dtype=torch.uint8))
    assert torch.equal(unpack_fp4_from_uint8(packed, 4, 32, torch.float32), values)


# --- transformers: BitNet and gpt-oss ------------------------------------------------------------------------
@pytest.mark.parametrize("linear_class", ["bitlinear", "autobitlinear"])
def test_bitnet_matches_transformers(tmp_path, linear_class):
    from transformers.integrations.bitnet import pack_weights, unpack_weights

    unpack = getattr(unpack_weights, "_torchdynamo_orig_callable", unpack_weights)  # skip torch.compile
    torch.manual_seed(0)
    ternary = torch.randint(-1, 2, (64, 48)).to(torch.bfloat16)
    packed = pack_weights(ternary.clone())
    ws = torch.tensor([0.375], dtype=torch.bfloat16)
    write_checkpoint(tmp_path, {"l.weight": packed, "l.weight_scale": ws},
                     {"quant_method": "bitnet", "linear_class": linear_class})
    qw = load_layer(tmp_path, "l")
    t = unpack(packed, torch.float64)
    expected = t / 0.375 if linear_class == "bitlinear" else t * 0.375
    assert torch.equal(qw.dequantize(torch.float64), expected.to(torch.float32).to(torch.float64))


def test_gpt_oss_matches_transformers(tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(0)
    e, n, k = 3, 40, 96
    blocks = torch.randint(0, 256, (e, n, k // 32, 16), dtype=torch.uint8)
    scales = torch.randint(110, 140, (e, n, k // 32), dtype=torch.uint8)
    prefix = "model.layers.0.mlp.experts.gate_up_proj"
    write_checkpoint(tmp_path, {f"{prefix}_blocks": blocks, f"{prefix}_scales": scales,
                                f"{prefix}_bias": torch.zeros(e, n)}, {"quant_method": "mxfp4"})
    qw = load_layer(tmp_path, prefix)
    assert qw.shape == (e, n, k)
    reference = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)  # (E, K, N)
    assert torch.equal(qw.dequantize(torch.bfloat16).transpose(1, 2), reference)


# --- optional heavy oracles ----------------------------------------------------------------------------------
@pytest.mark.parametrize("nbits,sym,act_order,fmt", [
    (4, True, False, "gptq"), (4, False, False, "gptq"), (3, True, False, "gptq"), (3, False, True, "gptq"),
    (2, False, False, "gptq"), (8, True, True, "gptq"), (4, False, True, "gptq_v2"), (8, False, False, "gptq_v2")])
def test_gptq_matches_autogptq(tmp_path, nbits, sym, act_order, fmt):
    """AutoGPTQ 0.7.1 `qlinear_cuda.QuantLinear.pack` (v1 zeros: z - 1) writes the checkpoint and its CPU
    forward on an identity input is the dequantization oracle; v2 rewrites qzeros with zeros + 1 per field."""
    mod = load_file_module("auto_gptq", "nn_modules/qlinear/qlinear_cuda.py")
    torch.manual_seed(0)
    n, k, g = 64, 128, 32
    groups = k // g
    lo = 1 if not sym else 0  # v1 cannot store zero point 0
    zeros = torch.full((n, groups), 1 << (nbits - 1)) if sym else torch.randint(lo, 1 << nbits, (n, groups))
    scales = (torch.rand(n, groups) * 0.1 + 0.01).half()
    g_idx = (torch.argsort(torch.rand(k)).argsort() // g if act_order else torch.arange(k) // g).int()
    codes = torch.randint(0, 1 << nbits, (n, k))
    w = (scales.float()[:, g_idx.long()] * (codes - zeros[:, g_idx.long()])).half()
    linear = torch.nn.Linear(k, n, bias=False).half()
    linear.weight.data = w
    ql = mod.QuantLinear(nbits, g, k, n, bias=False)
    ql.pack(linear, scales.float(), zeros.float(), g_idx=g_idx)
    reference = ql(torch.eye(k, dtype=torch.float16)).T  # (N, K)
    qzeros = ql.qzeros
    if fmt == "gptq_v2":
        qzeros = bits.pack(bits.unpack(qzeros, nbits, n, dim=1).to(torch.int64) + 1, nbits, dim=1)
    prefix = "model.layers.0.self_attn.o_proj"
    write_checkpoint(tmp_path, {f"{prefix}.qweight": ql.qweight, f"{prefix}.qzeros": qzeros,
                                f"{prefix}.scales": ql.scales, f"{prefix}.g_idx": ql.g_idx},
                     {"bits": nbits, "group_size": g, "desc_act": act_order, "sym": sym, "checkpoint_format": fmt},
                     config_name="quantize_config.json")
    qw = load_layer(tmp_path, prefix)
    assert (qw.k_perm is not None) == act_order
    assert torch.equal(qw.dequantize(torch.float16), reference)


def test_awq_matches_autoawq(tmp_path):
    """AutoAWQ 0.2.9 `awq.utils.packing_utils.dequantize_gemm` is the oracle for a GEMM-layout checkpoint whose
    qweight/qzeros follow `WQLinear_GEMM.from_linear`'s packing loop (reproduced in test_converters.py)."""
    packing = load_file_module("awq", "utils/packing_utils.py")
    torch.manual_seed(0)
    k, n, g = 128, 64, 32
    qweight = torch.randint(-2**31, 2**31 - 1, (k, n // 8), dtype=torch.int32)
    qzeros = torch.randint(-2**31, 2**31 - 1, (k // g, n // 8), dtype=torch.int32)
    scales = (torch.rand(k // g, n) * 0.1).half()
    write_checkpoint(tmp_path, {"l.qweight": qweight, "l.qzeros": qzeros, "l.scales": scales},
                     {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True, "version": "gemm"})
    reference = packing.dequantize_gemm(qweight, qzeros, scales, 4, g)  # (K, N) fp16
    assert torch.equal(load_layer(tmp_path, "l").dequantize(torch.float16).T, reference)


def test_modelopt_nvfp4_matches_modelopt(tmp_path):
    """ModelOpt's NVFP4QTensor.quantize writes weight / weight_scale / weight_scale_2; its dequantize (float32
    math: (s_b * s2) then * q) is matched to within one float32 rounding, codes and scales bit for bit."""
    try:
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    except ImportError as e:
        oracle_missing(f"optional oracle nvidia-modelopt not importable: {e}")
    torch.manual_seed(0)
    w = torch.randn(64, 128)
    qt, s_b, s2 = NVFP4QTensor.quantize(w, 16)
    write_checkpoint(tmp_path, {"l.weight": qt._quantized_data, "l.weight_scale": s_b,
                                "l.weight_scale_2": s2.reshape(()), "l.input_scale": torch.tensor(0.5)},
                     {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}},
                     config_name="hf_quant_config.json")
    qw = load_layer(tmp_path, "l")
    assert torch.equal(qw.codes, bits.unpack_nibbles(qt._quantized_data))
    assert torch.equal(qw.scales, s_b.float()) and torch.equal(qw.global_scale, s2.reshape(()).float())
    reference = qt.dequantize(dtype=torch.float32, scale=s_b, double_scale=s2, block_sizes={-1: 16})
    torch.testing.assert_close(qw.dequantize(), reference, rtol=2 ** -22, atol=0)


def test_ocp_mxfp4_matches_torchao(tmp_path):
    """torchao's to_mx (FLOOR rule) produces e8m0 scales and packed fp4 data; its MXTensor dequantize is the
    oracle for the plain OCP layout (weight uint8 (N, K/2), weight_scale uint8 (N, K/32))."""
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
    except ImportError as e:
        oracle_missing(f"optional oracle torchao not importable: {e}")
    torch.manual_seed(0)
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    mx = MXTensor.to_mx(w, torch.float4_e2m1fn_x2, block_size=32)
    packed = mx.qdata.view(torch.uint8).reshape(64, 64)
    scale = mx.scale.view(torch.uint8).reshape(64, 4)
    write_checkpoint(tmp_path, {"l.weight": packed, "l.weight_scale": scale}, {"quant_method": "mxfp4"})
    assert torch.equal(load_layer(tmp_path, "l").dequantize(torch.bfloat16), mx.dequantize(torch.bfloat16))
