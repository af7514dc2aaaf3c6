"""MoE checkpoints end to end on the GPU: synthetic gpt-oss MXFP4 (interleaved gate_up, biases, swiglu),
compressed-tensors W4A16 and DeepSeek FP8 block (run weight-only) checkpoints, written as safetensors, built with
QuantMoE.from_checkpoint, against reference_fused_moe in float64 on the source's own dequantization (transformers,
compressed-tensors, docs/FORMATS.md 2.3)."""

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


def test_deepseek_fp8_block_checkpoint_runs_weight_only(tmp_path):
    torch.manual_seed(2)
    tensors, refs = {}, {}
    for e in range(E):
        for name, n, k in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
            codes = (torch.randn(n, k) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            scale = torch.rand(-(-n // 128), -(-k // 128)) * 5e-4 + 2e-4
            tensors[f"{PREFIX}.{e}.{name}.weight"] = codes
            tensors[f"{PREFIX}.{e}.{name}.weight_scale_inv"] = scale
            refs[e, name] = fp8_block_dequant(codes, scale)
    write_checkpoint(tmp_path, tensors, {"quant_method": "fp8", "activation_scheme": "dynamic",
                                         "weight_block_size": [128, 128]})
    moe = hg.QuantMoE.from_checkpoint(tmp_path, PREFIX, dtype=torch.bfloat16)
    w13 = torch.stack([torch.cat([refs[e, "gate_proj"], refs[e, "up_proj"]]) for e in range(E)])
    w2 = torch.stack([refs[e, "down_proj"] for e in range(E)])
    _check(moe, w13, w2)
