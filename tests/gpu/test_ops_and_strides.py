"""QuantLinear through the `humming_gen::gemm` ops on the GPU: opcheck, torch.compile (fullgraph, dynamic M, the
same results as eager), CUDA-graph capture, no host synchronisation in forward, row-strided inputs read in place
and `out=` against the float64 reference.

Inputs are fresh random values, outputs are poisoned (NaN) before each launch; M values cover both pipelines on
sm_90a (the standard one up to 32 rows, the warp-specialized one from 33) and the split-K buckets.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.reference import reference_gemm

pytestmark = pytest.mark.gpu

N, K = 768, 1024
M_VALUES = (1, 7, 33, 300)
TOLERANCE = 1.2e-2  # relative Frobenius error, bf16 outputs (tests/gpu/test_linear.py)


@pytest.fixture(scope="module")
def layer_and_weight():
    torch.manual_seed(0)
    qw = hg.QuantScheme("uint4", group_size=128, zero_point="int").quantize(torch.randn(N, K, device="cuda") * 0.05)
    bias = (torch.randn(N, device="cuda") * 0.1).bfloat16()
    return hg.QuantLinear.from_quantized(qw, bias=bias), qw, bias


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def reference(x: torch.Tensor, qw, bias) -> torch.Tensor:
    return reference_gemm(x.reshape(-1, K).double(), qw, bias=bias.double()).reshape(*x.shape[:-1], N)


def test_opcheck(layer_and_weight):
    layer, _, _ = layer_and_weight
    for m in (1, 40):
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        strided = torch.randn(m, 2 * K, device="cuda", dtype=torch.bfloat16)[:, K:]
        out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        for op, args in ((torch.ops.humming_gen.gemm.default, (x, layer._op_id)),
                         (torch.ops.humming_gen.gemm.default, (strided, layer._op_id)),
                         (torch.ops.humming_gen.gemm_out.default, (x, out, layer._op_id))):
            result = torch.library.opcheck(op, args)
            assert set(result.values()) == {"SUCCESS"}, result


def test_compile_fullgraph_dynamic_m_matches_eager(layer_and_weight):
    layer, qw, bias = layer_and_weight
    model = torch.nn.Sequential(layer, torch.nn.ReLU())
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for m in M_VALUES:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        y = compiled(x)
        assert torch.equal(y, model(x)), f"m={m}: compiled and eager results differ"
        assert rel_err(y, torch.relu(reference(x, qw, bias))) < TOLERANCE
    torch._dynamo.reset()


def test_cuda_graph_capture_and_replay(layer_and_weight):
    layer, qw, bias = layer_and_weight
    for m in M_VALUES:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        layer(x, out=out)  # warm-up: module load and launch configs outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(x, out=out)
        for _ in range(2):
            x.copy_(torch.randn(m, K, device="cuda"))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.isfinite(out).all(), f"m={m}: poison left after replay"
            assert rel_err(out, reference(x, qw, bias)) < TOLERANCE, f"m={m}"


def test_forward_does_not_synchronise_the_host(layer_and_weight):
    layer, _, _ = layer_and_weight
    torch.manual_seed(1)
    qperm = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(N, K, device="cuda") * 0.05)
    qperm.k_perm = torch.randperm(K, device="cuda")
    act_order = hg.QuantLinear.from_quantized(qperm)
    inputs = [torch.randn(m, 2 * K, device="cuda", dtype=torch.bfloat16)[:, :K] for m in M_VALUES]
    for x in inputs:  # first calls load modules (a synchronising driver call) outside the check
        layer(x), act_order(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x in inputs:
            layer(x)
            act_order(x)
            layer(x, out=torch.empty(x.shape[0], N, device="cuda", dtype=torch.bfloat16))
    finally:
        torch.cuda.set_sync_debug_mode(0)


STRIDED = {  # id -> activation builder; the first three are read in place, the others copied (tests/cpu checks which)
    "2d-row-stride-2048": lambda m: torch.randn(m, 2 * K, device="cuda").bfloat16()[:, K:],
    "2d-offset-8-stride-1032": lambda m: torch.randn(m, K + 8, device="cuda").bfloat16()[:, 8:],
    "3d-uniform-rows": lambda m: torch.randn(m, 3, 2 * K, device="cuda").bfloat16()[:, :, 512:512 + K],
    "2d-row-stride-1028-copied": lambda m: torch.randn(m, K + 4, device="cuda").bfloat16()[:, 4:],
    "3d-uneven-rows-copied": lambda m: torch.randn(m, 5, K, device="cuda").bfloat16()[:, :3],
    "transposed-copied": lambda m: torch.randn(K, m, device="cuda").bfloat16().t(),
}


@pytest.mark.parametrize("case", list(STRIDED), ids=list(STRIDED))
@pytest.mark.parametrize("m", M_VALUES, ids=[f"m{m}" for m in M_VALUES])
def test_row_strided_inputs_match_reference(layer_and_weight, case, m):
    layer, qw, bias = layer_and_weight
    x = STRIDED[case](m)
    rows = x.numel() // K
    big = torch.full((rows, 3 * N), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, N:2 * N].view(*x.shape[:-1], N)  # row stride 3N
    y = layer(x, out=out)
    assert y is out and torch.isfinite(out).all(), "poison left in out"
    assert big[:, :N].isnan().all() and big[:, 2 * N:].isnan().all(), "the kernel wrote outside out"
    ref = reference(x, qw, bias)
    assert rel_err(out, ref) < TOLERANCE
    # the same kernel on a contiguous copy: bitwise the same (split-K sums in slice order)
    assert torch.equal(layer(x.contiguous()), out)


STAGED = {  # scheme -> (N, K, M) whose warp-specialized kernel stores whole tiles through its staging (no split-K)
    "w4a16-int4-g128": (8192, 512, 1000),
    "w8a8-fp8-channel": (4096, 512, 1000),
}


@pytest.mark.parametrize("scheme", list(STAGED))
def test_unaligned_out_matches_reference(scheme):
    """An `out` 2 bytes past a 16-byte boundary with an odd row stride: the warp-specialized epilogue's 16-byte stores
    cannot reach it, so its staged rows leave through scalar stores (the same values as an aligned `out`)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the staged epilogue is the warp-specialized pipeline's (sm_90a)")
    torch.manual_seed(1)
    n, k, m = STAGED[scheme]
    qw = hg.scheme(scheme).quantize(torch.randn(n, k, device="cuda") * 0.05)
    layer = hg.QuantLinear.from_quantized(qw)
    assert "stmatrix_x2_trans(staging" in layer.kernel_for(m).source  # the path this test is about
    x = torch.randn(m, k, device="cuda").bfloat16()
    big = torch.full((m, 3 * n + 1), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, 1:n + 1]  # data_ptr % 16 == 2, row stride 3N + 1
    y = layer(x, out=out)
    assert y is out and torch.isfinite(out).all(), "poison left in out"
    assert big[:, :1].isnan().all() and big[:, n + 1:].isnan().all(), "the kernel wrote outside out"
    assert rel_err(out, reference_gemm(x.double(), qw)) < TOLERANCE  # x quantized as the scheme says, in float64
    assert torch.equal(layer(x), out)
