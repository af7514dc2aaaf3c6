"""device="cuda" (no index) builds layers whose forward accepts tensors on the current CUDA device: a layer's device
compares equal to its inputs' (torch.device("cuda") != torch.device("cuda:0"))."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm
from humming_gen.reference.moe import reference_fused_moe

pytestmark = pytest.mark.gpu


def test_quant_linear_and_moe_take_device_cuda() -> None:
    torch.manual_seed(0)
    qw = hg.scheme("w4a16-int4-g128").quantize(torch.randn(256, 512, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, device="cuda")
    assert layer.device == torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(3, 512, device="cuda").bfloat16()
    ref = reference_gemm(x.double(), qw)
    assert ((layer(x).double() - ref).norm() / ref.norm()).item() < 8e-3
    w13, w2 = torch.randn(4, 256, 128, device="cuda") * 0.05, torch.randn(4, 128, 128, device="cuda") * 0.05
    s = hg.scheme("w4a16-int4-g128")
    q13, q2 = s.quantize(w13), s.quantize(w2)
    moe = hg.QuantMoE.from_quantized(q13, q2, device="cuda")
    assert moe.device == torch.device("cuda", torch.cuda.current_device())
    weights, ids = torch.topk(torch.softmax(torch.randn(5, 4, device="cuda"), -1), 2, dim=-1)
    xm = torch.randn(5, 128, device="cuda").bfloat16()
    y = moe(xm, weights, ids.to(torch.int32))
    ref = reference_fused_moe(xm.double(), q13.dequantize().double(), q2.dequantize().double(), weights.double(),
                              ids.to(torch.int32))
    assert y.shape == (5, 128) and ((y.double() - ref).norm() / ref.norm()).item() < 2e-2
