"""MoE checkpoints end to end on the GPU: synthetic gpt-oss MXFP4 (interleaved gate_up, biases, swiglu),
compressed-tensors W4A16 and DeepSeek FP8 block (run weight-only, and W8A8 with the checkpoint's fp8 activations)
checkpoints, written as safetensors, built with QuantMoE.from_checkpoint (or load_moe + from_quantized), against
reference_fused_moe in float64 on the source's own dequantization (transformers, compressed-tensors,
docs/FORMATS.md 2.3)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import humming_gen as hg
from humming_gen.reference.moe import reference_fused_moe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))
from converter_fixtures import ct_compress, write_checkpoint  # noqa: E402
from test_moe_converters import E, H, I, PREFIX, fp8_block_dequant, gpt_oss_tensors  # noqa: E402
from test_quant_moe_a8 import LAYER_TOLERANCE  # noqa: E402  (tests/gpu: 8-bit activation MoE bounds)

pytestmark = pytest.mark.gpu

TOLERANCE = 2e-2  # bf16 activations, GEMM1 output and activation rounded to bf16 (tests/gpu/test_quant_moe.py)


def _check(moe: hg.QuantMoE, w13: torch.Tensor, w2: torch.Tensor, bias13=None, bias2=None) -> None:
    errors = {}
    for m in (1, 7, 200):
        torch.manual_seed(m)
        x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
        weights, ids = torch.topk(torch.softmax(torch.randn(m, E, device="cuda"), -1), 2, dim=-1)
        out = moe(x, weights, ids)
        ref = reference_fused_moe(x.double(), w13.cuda().double(), w2.cuda().double(), weights.double(), ids,
                                  activation=moe.activation, gate_up_layout=moe.gate_up_layout,
                                  bias13=None if bias13 is None else bias13.cuda().double(),
                                  bias2=None if bias2 is None else bias2.cuda().double())
        assert torch.isfinite(out).all(), f"m={m}"
        errors[m] = ((out.double() - ref).norm() / ref.norm()).item()
    assert all(err < TOLERANCE for err in errors.values()), errors


def test_gpt_oss_mxfp4_checkpoint(tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = gpt_oss_tensors(PREFIX)
    for name in ("gate_up_proj_scales", "down_proj_scales"):  # weights of about 0.1: the swiglu clamps now and then
        tensors[f"{PREFIX}.{name}"] = torch.randint(119, 124, tensors[f"{PREFIX}.{name}"].shape, dtype=torch.uint8)
    write_checkpoint(tmp_path, tensors, {"quant_method": "mxfp4"})
    moe = hg.QuantMoE.from_checkpoint(tmp_path, PREFIX, dtype=torch.bfloat16)
    w13, w2 = (convert_moe_packed_tensors(tensors[f"{PREFIX}.{n}_blocks"], tensors[f"{PREFIX}.{n}_scales"],
                                          dtype=torch.float32).transpose(1, 2) for n in ("gate_up_proj", "down_proj"))
    _check(moe, w13, w2, tensors[f"{PREFIX}.gate_up_proj_bias"], tensors[f"{PREFIX}.down_proj_bias"])


def test_compressed_tensors_w4a16_checkpoint(tmp_path):
    pytest.importorskip("compressed_tensors")
    torch.manual_seed(1)
    tensors, refs, cfg = {}, {}, None
    for e in range(E):
        for name, n, k in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
            state, cfg, refs[e, name] = ct_compress(torch.randn(n, k, dtype=torch.bfloat16) * 0.05, "W4A16")
            tensors.update({f"{PREFIX}.{e}.{name}.{key}": v for key, v in state.items()})
    write_checkpoint(tmp_path, tensors, cfg)
    moe = hg.QuantMoE.from_checkpoint(tmp_path, PREFIX, dtype=torch.bfloat16)
    w13 = torch.stack([torch.cat([refs[e, "gate_proj"], refs[e, "up_proj"]]) for e in range(E)])
    w2 = torch.stack([refs[e, "down_proj"] for e in range(E)])
    _check(moe, w13, w2)


def _deepseek_fp8_block_checkpoint(path) -> tuple[torch.Tensor, torch.Tensor]:
    """A DeepSeek FP8 block MoE checkpoint written to `path`: E per-expert gate / up / down modules of e4m3 codes
    and fp32 128 x 128 weight_scale_inv, dynamic activations. Returns (w13, w2) dequantized by the block definition
    (float64, CPU)."""
    torch.manual_seed(2)
    tensors, refs = {}, {}
    for e in range(E):
        for name, n, k in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
            codes = (torch.randn(n, k) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            scale = torch.rand(-(-n // 128), -(-k // 128)) * 5e-4 + 2e-4
            tensors[f"{PREFIX}.{e}.{name}.weight"] = codes
            tensors[f"{PREFIX}.{e}.{name}.weight_scale_inv"] = scale
            refs[e, name] = fp8_block_dequant(codes, scale)
    write_checkpoint(path, tensors, {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]})
    w13 = torch.stack([torch.cat([refs[e, "gate_proj"], refs[e, "up_proj"]]) for e in range(E)])
    w2 = torch.stack([refs[e, "down_proj"] for e in range(E)])
    return w13, w2


def test_deepseek_fp8_block_checkpoint_runs_weight_only(tmp_path):
    w13, w2 = _deepseek_fp8_block_checkpoint(tmp_path)
    moe = hg.QuantMoE.from_checkpoint(tmp_path, PREFIX, dtype=torch.bfloat16)
    _check(moe, w13, w2)


def test_deepseek_fp8_block_checkpoint_with_fp8_activations(tmp_path):
    """load_moe, then QuantMoE.from_quantized(w.q13, w.q2) keeps the checkpoint's activation scheme: e4m3 per 1 x
    128 group, dynamic (H = 384 and I = 128 tile into 128-groups: both GEMMs run W8A8, strict=True refuses a
    fallback). fused_moe into a NaN-poisoned output against the float64 reference on the block definition with
    both GEMM inputs quantized as the layer quantizes them (test_quant_moe_a8.py's references and bounds; no fused
    activation: block-scaled w13 cannot). Without quantizing the activations the reference moves by more than the
    bound, so a layer that ran them in bf16 would fail."""
    w13, w2 = (t.cuda() for t in _deepseek_fp8_block_checkpoint(tmp_path))
    w = hg.load_moe(tmp_path, PREFIX)
    act = w.q13.scheme.activation
    assert (act.dtype.name, act.granularity, act.group_size) == ("float8e4m3", "group", 128)
    moe = hg.QuantMoE.from_quantized(w.q13, w.q2, activation=w.activation, gate_up_layout=w.gate_up_layout,
                                     dtype=torch.bfloat16, strict=True)
    assert moe.activation_schemes == (act, act) and moe.compute_dtypes == ("float8e4m3", "float8e4m3")
    assert not moe.fused_activation
    tolerance = LAYER_TOLERANCE["float8e4m3"]
    errors, unquantized = {}, {}
    for m in (1, 7, 200):
        torch.manual_seed(m)
        x = torch.randn(m, moe.hidden, device="cuda").bfloat16()
        x[0, :5] *= 20  # an outlier token: its 1 x 128 group scales differ from the others by an order of magnitude
        weights, ids = torch.topk(torch.softmax(torch.randn(m, E, device="cuda"), -1), 2, dim=-1)
        out = torch.full((m, moe.hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        assert hg.fused_moe(x, moe, weights, ids, output=out) is out
        assert torch.isfinite(out).all(), f"m={m}: rows left unwritten or non-finite"
        common = dict(activation=moe.activation, gate_up_layout=moe.gate_up_layout, intermediate_dtype=moe.dtype,
                      fused_activation=moe.fused_activation)
        ref = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, activation_scheme=act, **common)
        errors[m] = ((out.double() - ref).norm() / ref.norm()).item()
        plain = reference_fused_moe(x.double(), w13, w2, weights.double(), ids, **common)
        unquantized[m] = ((plain - ref).norm() / ref.norm()).item()
    assert all(err < tolerance for err in errors.values()), errors
    assert unquantized[200] > tolerance, f"the 8-bit activations move the reference by only {unquantized}"
