"""QuantLinear's host path without a GPU: the `humming_gen::gemm` / `gemm_out` ops (registration, fake
implementation, opcheck, torch.compile without graph breaks at dynamic M) and the activation / output matrices
handed to the kernel (row-strided views read in place, copies only where the kernel cannot read them, `out=`).

The layer is built for sm_90a on the CPU; its launchers are replaced by a recorder that computes the product
from exactly the matrices (pointer, row stride, columns) a kernel would get, in float64, through the row stride.
"""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg

N, K = 256, 512


class Recorder:
    """Stands in for a bound launcher: remembers (a, c) and writes c = a[:, :K] @ W_stored^T through c's strides."""

    def __init__(self, w_stored: torch.Tensor):
        self.w_stored = w_stored
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, a: torch.Tensor, c: torch.Tensor) -> None:
        assert a.dim() == 2 and c.dim() == 2 and a.stride(1) == 1 and c.stride(1) == 1
        assert a.stride(0) % 8 == 0 and a.data_ptr() % 16 == 0 and a.shape[1] % 8 == 0
        self.calls.append((a, c))
        k = self.w_stored.shape[1]
        c.copy_((a[:, :k].double() @ self.w_stored.T).to(c.dtype))


def make_layer(k_perm: bool = False, k: int = K) -> tuple[hg.QuantLinear, Recorder, torch.Tensor]:
    torch.manual_seed(0)
    qw = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(N, k) * 0.05)
    if k_perm:
        qw.k_perm = torch.randperm(k)
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu")
    w = qw.dequantize(torch.float64)
    recorder = Recorder(w[:, qw.k_perm] if k_perm else w)
    layer._launchers = [(m_max, recorder) for m_max, _ in layer._launchers]
    return layer, recorder, w


@pytest.fixture(scope="module")
def built():
    return make_layer()


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.T).to(torch.bfloat16)


def test_op_is_registered_with_a_data_independent_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer, _, _ = make_layer()
    assert hasattr(torch.ops.humming_gen, "gemm") and hasattr(torch.ops.humming_gen, "gemm_out")
    with FakeTensorMode():
        for shape in ((7, K), (3, 5, K), (K,), (0, K)):
            y = layer(torch.empty(shape, dtype=torch.bfloat16))
            assert tuple(y.shape) == (*shape[:-1], N) and y.dtype == torch.bfloat16
        with pytest.raises(ValueError, match=r"expected \(\.\.\., 512\)"):
            layer(torch.empty(7, K + 1, dtype=torch.bfloat16))


def test_opcheck_passes(built):
    layer, _, _ = built
    x = torch.randn(5, K, dtype=torch.bfloat16)
    strided = torch.randn(2, 9, 2 * K, dtype=torch.bfloat16)[..., :K]
    for args in ((x, layer._op_id), (strided, layer._op_id)):
        result = torch.library.opcheck(torch.ops.humming_gen.gemm.default, args)
        assert set(result.values()) == {"SUCCESS"}, result
    out = torch.empty(5, N, dtype=torch.bfloat16)
    result = torch.library.opcheck(torch.ops.humming_gen.gemm_out.default, (x, out, layer._op_id))
    assert set(result.values()) == {"SUCCESS"}, result


def test_compile_fullgraph_dynamic_m_has_one_graph_and_no_break(built):
    layer, _, w = built
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # runs the real op (its launcher is the recorder)

    model = torch.nn.Sequential(layer, torch.nn.ReLU())
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    for m in (3, 17, 100):
        x = torch.randn(m, K, dtype=torch.bfloat16)
        torch.testing.assert_close(compiled(x), torch.relu(reference(x, w)), rtol=0, atol=0)
    assert len(graphs) == 1, f"{len(graphs)} graphs for three row counts"
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert torch.ops.humming_gen.gemm in targets or torch.ops.humming_gen.gemm.default in targets, targets
    torch._dynamo.reset()


def test_symbolic_trace_of_out_variant(built):
    from torch.fx.experimental.proxy_tensor import make_fx

    layer, _, _ = built
    x, out = torch.randn(6, K, dtype=torch.bfloat16), torch.empty(6, N, dtype=torch.bfloat16)
    graph = make_fx(lambda x, o: layer(x, out=o), tracing_mode="symbolic")(x, out)
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"] == [
        torch.ops.humming_gen.gemm_out.default]


def test_dropped_layer_id_is_refused():
    layer, _, _ = make_layer()
    layer_id = layer._op_id
    del layer
    import gc

    gc.collect()
    with pytest.raises(ValueError, match=f"layer_id {layer_id} names no live QuantLinear"):
        torch.ops.humming_gen.gemm(torch.empty(1, K, dtype=torch.bfloat16), layer_id)


# --- what the kernel is handed ----------------------------------------------------------------------------
def buffer_slice(rows: int, width: int, offset: int = 0) -> torch.Tensor:
    return torch.randn(rows, width, dtype=torch.bfloat16)[:, offset:offset + K]


IN_PLACE = {  # id -> activation the kernel reads without a copy
    "2d-row-stride-1024": lambda: buffer_slice(9, 1024),
    "2d-row-stride-520-offset-8": lambda: buffer_slice(9, 520, 8),
    "3d-uniform-rows": lambda: torch.randn(3, 5, 1024, dtype=torch.bfloat16)[..., 256:256 + K],
    "3d-contiguous": lambda: torch.randn(3, 5, K, dtype=torch.bfloat16),
}
COPIED = {  # id -> activation the kernel cannot read in place
    "row-stride-516": lambda: buffer_slice(9, 516),
    "offset-4-misaligned": lambda: buffer_slice(9, 1024, 4),
    "transposed": lambda: torch.randn(K, 9, dtype=torch.bfloat16).t(),
    "3d-uneven-rows": lambda: torch.randn(3, 8, K, dtype=torch.bfloat16)[:, :5],
}


@pytest.mark.parametrize("case", list(IN_PLACE), ids=list(IN_PLACE))
def test_row_strided_activation_is_read_in_place(built, case):
    layer, recorder, w = built
    x = IN_PLACE[case]()
    recorder.calls.clear()
    y = layer(x)
    (a, _), = recorder.calls
    assert a.data_ptr() == x.data_ptr(), "the activation was copied"
    assert a.stride(0) == x.stride(-2)
    torch.testing.assert_close(y, reference(x, w), rtol=0, atol=0)


@pytest.mark.parametrize("case", list(COPIED), ids=list(COPIED))
def test_unreadable_activation_is_copied(built, case):
    layer, recorder, w = built
    x = COPIED[case]()
    recorder.calls.clear()
    y = layer(x)
    (a, _), = recorder.calls
    assert a.data_ptr() != x.data_ptr() and a.is_contiguous()
    assert tuple(y.shape) == (*x.shape[:-1], N)
    torch.testing.assert_close(y, reference(x, w), rtol=0, atol=0)


def test_act_order_and_unaligned_k_copy_in_stored_order():
    for k_perm, k in ((True, K), (False, 500)):
        layer, recorder, w = make_layer(k_perm=k_perm, k=k)
        x = torch.randn(6, 1024, dtype=torch.bfloat16)[:, :k]
        torch.testing.assert_close(layer(x), reference(x, w), rtol=0, atol=0)
        (a, _), = recorder.calls
        assert a.data_ptr() != x.data_ptr()


def test_out_is_written_in_place_through_its_row_stride(built):
    layer, recorder, w = built
    x = buffer_slice(7, 1024)
    big = torch.full((7, 3 * N), float("nan"), dtype=torch.bfloat16)
    out = big[:, N:2 * N]
    assert layer(x, out=out) is out
    (_, c), = recorder.calls[-1:]
    assert c.data_ptr() == out.data_ptr() and c.stride(0) == 3 * N
    torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0)
    assert big[:, :N].isnan().all() and big[:, 2 * N:].isnan().all(), "wrote outside out"
    out3 = torch.empty(2, 4, 2 * N, dtype=torch.bfloat16)[..., :N]
    x3 = torch.randn(2, 4, K, dtype=torch.bfloat16)
    layer(x3, out=out3)
    torch.testing.assert_close(out3, reference(x3, w), rtol=0, atol=0)


def test_bad_out_is_refused_naming_the_argument(built):
    layer, _, _ = built
    x = torch.randn(4, K, dtype=torch.bfloat16)
    cases = [
        (torch.empty(4, N, dtype=torch.float16), r"out has dtype torch.float16; this layer writes torch.bfloat16"),
        (torch.empty(4, N + 1, dtype=torch.bfloat16), r"out has shape \(4, 257\); expected \(4, 256\)"),
        (torch.empty(4, N, dtype=torch.bfloat16, device="meta"), r"out is on meta"),
        (torch.empty(N, 4, dtype=torch.bfloat16).t(), r"unit column stride"),
        (torch.empty(1, N, dtype=torch.bfloat16).expand(4, N), r"row stride in \[256, 2147483647\] elements, got 0"),
        ("not a tensor", r"out must be a torch.Tensor, got str"),
    ]
    for out, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            layer(x, out=out)
    uneven = torch.empty(2, 6, N, dtype=torch.bfloat16)[:, :4]
    with pytest.raises(ValueError, match=r"rows evenly spaced"):
        layer(torch.randn(2, 4, K, dtype=torch.bfloat16), out=uneven)


def test_bad_input_is_refused_naming_the_argument(built):
    layer, _, _ = built
    with pytest.raises(ValueError, match=r"x has dtype torch.float16; this layer was built for torch.bfloat16"):
        layer(torch.randn(4, K, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"x is on meta"):
        layer(torch.empty(4, K, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        layer([1.0])
