"""device="cuda" (no index) builds layers whose forward accepts tensors on the current CUDA device: a layer's device
compares equal to its inputs' (torch.device("cuda") != torch.device("cuda:0"))."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm

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
    moe = hg.QuantMoE.from_float(w13, w2, "w4a16-int4-g128", device="cuda")
    weights, ids = torch.topk(torch.softmax(torch.randn(5, 4, device="cuda"), -1), 2, dim=-1)
    y = moe(torch.randn(5, 128, device="cuda").bfloat16(), weights, ids.to(torch.int32))
    assert y.shape == (5, 128) and torch.isfinite(y).all()
