"""The host path of one eager forward call (issue 10: eager within a few microseconds of CUDA-graph time), checked
by structure, not by wall time: layers built for sm_90a on the CPU with only the driver stubbed (module load,
launch config, cuLaunchKernelEx, current stream), so runtime.launch, the Launcher's packing, quantize_activation's
and moe_align's launch paths all run. Per forward: the kernel launches, the torch ops (torch.profiler, which sets
no dispatch mode), no torch.library dispatch, no config building, and a budget of Python function calls; the direct
eager path launches exactly what the op path launches; tracing still sees the ops.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections import Counter

import pytest
import torch

import humming_gen as hg
import humming_gen.activation.api as api
import humming_gen.moe.align as align
import humming_gen.moe.reduce as reduce
import humming_gen.runtime as runtime
import humming_gen.runtime.tensor_map as tensor_map
from humming_gen.layer import eager
from humming_gen.layer.eager import direct_call
from humming_gen.runtime.module import LoadedKernel
from humming_gen.targets import get_target

launch_mod = sys.modules["humming_gen.runtime.launch"]  # the package's `launch` attribute is the function
TARGET = get_target("sm_90a")
N = K = 256
E, H, I, TOP_K = 16, 256, 128, 4

# Torch ops a GPU forward runs at M = 1 (top-level aten ops; every one a kernel launch or an allocation on a GPU).
# A change that adds one fails here: make it cheap or raise the budget with the reason. The CPU-only id range
# check of moe_align (min / max / item on CPU topk_ids, skipped for CUDA tensors) is left out.
LINEAR_OPS = {"w4a16-int4-g128": Counter({"aten::empty": 1}),          # the output
              "w8a8-fp8-channel": Counter({"aten::empty": 2})}         # output, codes + scales (RowQuantizer)
_MOE_OPS = Counter({"aten::empty": 9, "aten::to": 2, "aten::slice": 2,  # routing (6), h, the gated activation,
                    "aten::silu": 1, "aten::mul": 1, "aten::view": 1})    # GEMM2's rows, the top-k reduction's output
MOE_OPS = {"w4a16-int4-g128": _MOE_OPS,
           "w8a8-fp8-channel": _MOE_OPS + Counter({"aten::empty": 4})}  # codes and scales of both GEMM inputs
LAUNCHES = {("linear", "w4a16-int4-g128"): 1, ("linear", "w8a8-fp8-channel"): 2,   # (quantize,) GEMM
            ("moe", "w4a16-int4-g128"): 4, ("moe", "w8a8-fp8-channel"): 6}         # align, (quantize,) 2 GEMMs, sum
# Python function calls of one warm forward (sys.setprofile 'call' events), about 25% above today's count.
PY_CALLS = {("linear", "w4a16-int4-g128"): 24, ("linear", "w8a8-fp8-channel"): 32,   # today 19, 26
            ("moe", "w4a16-int4-g128"): 65, ("moe", "w8a8-fp8-channel"): 95}         # today 52, 76
CPU_ONLY = {"aten::min", "aten::max", "aten::item"}
FORMATS = ("w4a16-int4-g128", "w8a8-fp8-channel")


@pytest.fixture(autouse=True)
def direct_eager(monkeypatch):
    """The direct eager path (on by default; HUMMING_GEN_DIRECT_EAGER=0 turns it off): these tests check it."""
    monkeypatch.setattr(eager, "ENABLED", True)


@pytest.fixture
def launches(monkeypatch):
    """Stub the driver below runtime.launch; return the list of (kernel name, grid, params) launched."""
    calls = []

    def load(compiled, smem=0):
        return LoadedKernel(compiled=compiled, function=compiled.kernel_name, device=0, dynamic_smem_bytes=smem,
                            num_regs=0, static_smem_bytes=0, max_dynamic_smem_bytes=1 << 20, local_bytes=0,
                            max_threads_per_block=1024, param_size=None)

    def spy(fn, grid, block, smem, params, **kw):  # then the real runtime.launch, down to the stubbed driver
        calls.append((fn.kernel_name, grid, bytes(params)))
        return launch(fn, grid, block, smem, params, **kw)

    launch = launch_mod.launch
    monkeypatch.setattr(runtime, "launch", spy)
    monkeypatch.setattr(runtime, "load", load)
    monkeypatch.setattr(launch_mod, "_make_config", lambda *args: (object(), []))
    monkeypatch.setattr(launch_mod, "_launch_fn", lambda config, function, argv, flags: (0,))
    monkeypatch.setattr(launch_mod, "_success", 0)
    monkeypatch.setattr(launch_mod, "_stream_getter", lambda: 0)
    # (a tensor map is encoded by the driver: a stand-in of its 128 bytes)
    monkeypatch.setattr(tensor_map, "encode_activation_map", lambda address, *args: struct.pack("<Q", address) * 16)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(api, "_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(api, "_target", lambda device: TARGET)
    monkeypatch.setattr(align, "_target", lambda index: TARGET)
    monkeypatch.setattr(reduce, "_DEVICE_TYPES", ("cuda", "cpu"))

    def align_cuda_path(topk_ids, num_experts, block_m, expert_map=None):  # the kernels' path, on CPU tensors
        outputs = align._empty_outputs(topk_ids, num_experts, block_m)
        align._launch(topk_ids, num_experts, block_m, expert_map, outputs)
        return outputs

    monkeypatch.setattr(align, "moe_align_reference", align_cuda_path)
    # fresh kernel objects and plans: the stand-in LoadedKernels they keep must not reach later (GPU) tests
    monkeypatch.setattr(api, "build", functools.lru_cache(maxsize=None)(api.build.__wrapped__))
    monkeypatch.setattr(align, "build", functools.lru_cache(maxsize=None)(align.build.__wrapped__))
    monkeypatch.setattr(api, "_plans", {})
    monkeypatch.setattr(align, "_kernels", {})
    monkeypatch.setattr(reduce, "build", functools.lru_cache(maxsize=None)(reduce.build.__wrapped__))
    monkeypatch.setattr(reduce, "_kernels", {})
    return calls


@pytest.fixture(scope="module")
def layers():
    torch.manual_seed(0)
    built = {}
    for fmt in FORMATS:
        s = hg.scheme(fmt)
        built["linear", fmt] = hg.QuantLinear.from_quantized(s.quantize(torch.randn(N, K) * 0.05), target="sm_90a",
                                                             device="cpu")
        built["moe", fmt] = hg.QuantMoE.from_quantized(s.quantize(torch.randn(E, 2 * I, H) * 0.05),
                                                       s.quantize(torch.randn(E, H, I) * 0.05), target="sm_90a",
                                                       device="cpu")
    return built


def _inputs(kind: str, m: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if kind == "linear":
        return (torch.randn(m, K, generator=g).bfloat16(),)
    weights, ids = torch.topk(torch.rand(m, E, generator=g), TOP_K, dim=-1)
    return torch.randn(m, H, generator=g).bfloat16(), weights, ids.to(torch.int32)


def _python_calls(fn) -> Counter:
    """Python functions entered by fn() (qualified names), by sys.setprofile."""
    seen: Counter = Counter()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_filename != __file__:  # not this file's stubs
            seen[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_qualname}"] += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["linear", "moe"])
def test_forward_host_path_structure(layers, launches, kind, fmt):
    layer, args = layers[kind, fmt], _inputs(kind)
    layer(*args)  # warm: kernels loaded, launch configs and per-config plans cached
    launches.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        layer(*args)
    assert len(launches) == LAUNCHES[kind, fmt], [name for name, _, _ in launches]
    events = prof.events()
    assert not [e.name for e in events if "humming_gen::" in e.name], "an eager forward dispatched a torch.library op"
    ops = Counter(e.name for e in events if e.cpu_parent is None and e.name not in CPU_ONLY)
    budget = (LINEAR_OPS if kind == "linear" else MOE_OPS)[fmt]
    assert not ops - budget, f"torch ops beyond the budget: {dict(ops - budget)} (all: {dict(ops)})"

    calls = _python_calls(lambda: layer(*args))
    built = [name for name in calls if any(word in name for word in ("Config.__init__", "compose", "evolve",
                                                                     "build", "get_target", "choose_tunings"))]
    assert not built, f"configs or kernels built per call: {built}"
    total = sum(calls.values())
    assert total <= PY_CALLS[kind, fmt], f"{total} Python calls per forward: {calls.most_common(15)}"


def _named(calls, names: dict[int, str]) -> list:
    """Launches with pointers of per-call allocations replaced by 'ptr' and known ones by their names."""
    out = []
    for name, grid, params in calls:
        words = struct.unpack(f"<{len(params) // 8}Q", params)
        out.append((name, grid, [names.get(w, "ptr" if w >= 1 << 40 else w) for w in words]))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 5, 37])
def test_direct_path_launches_what_the_op_launches(layers, launches, fmt, m):
    linear, moe = layers["linear", fmt], layers["moe", fmt]
    (x,) = _inputs("linear", m)
    y = linear(x)
    direct = _named(launches, {x.data_ptr(): "x", y.data_ptr(): "y"})
    launches.clear()
    y = torch.ops.humming_gen.gemm(x, linear._op_id)
    assert _named(launches, {x.data_ptr(): "x", y.data_ptr(): "y"}) == direct
    out = torch.empty(m, N).bfloat16()
    launches.clear()
    linear(x, out=out)
    assert _named(launches, {x.data_ptr(): "x", out.data_ptr(): "y"}) == direct

    x, weights, ids = _inputs("moe", m)
    launches.clear()
    moe(x, weights, ids)
    direct = _named(launches, {x.data_ptr(): "x", ids.data_ptr(): "ids"})
    launches.clear()
    torch.ops.humming_gen.fused_moe(x, moe._op_id, weights, ids, None)
    assert _named(launches, {x.data_ptr(): "x", ids.data_ptr(): "ids"}) == direct
    launches.clear()
    hg.fused_moe(x, moe, weights, ids, output=torch.empty(m, H).bfloat16())
    assert _named(launches, {x.data_ptr(): "x", ids.data_ptr(): "ids"}) == direct


def test_direct_call_only_for_plain_eager_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode

    x, results = torch.randn(2, 8), []
    assert direct_call(x, None)
    assert not direct_call(x.requires_grad_())
    assert not direct_call(torch.nn.Parameter(torch.randn(2)))
    with FakeTensorMode():
        assert not direct_call(torch.empty(2))
    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():
        assert not direct_call(torch.randn(2))
    torch.vmap(lambda t: (results.append(direct_call(t)), t)[1])(torch.randn(3, 2))
    assert results == [False]


def test_tracing_still_sees_the_ops(layers):
    from torch.fx.experimental.proxy_tensor import make_fx

    linear = layers["linear", "w4a16-int4-g128"]
    graph = make_fx(lambda x: linear(x), tracing_mode="symbolic")(*_inputs("linear", 3))
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"] == [torch.ops.humming_gen.gemm.default]
    moe = layers["moe", "w4a16-int4-g128"]
    graph = make_fx(moe, tracing_mode="symbolic")(*_inputs("moe", 3))
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"] == [
        torch.ops.humming_gen.fused_moe.default]


def test_direct_path_is_off_unless_enabled(monkeypatch):
    monkeypatch.setattr(eager, "ENABLED", False)
    assert not direct_call(torch.randn(2))


@pytest.mark.parametrize("scheme, k, m, kernel_tag, grid", [
    ("w8a8-fp8-channel", 256, 1000, "_token_w_", 125),    # per token, short rows: a warp per row, 8 rows per CTA
    ("w8a8-fp8-channel", 2048, 9, "_token_w_", 2),        # 256 vectors per row: the last that take a warp
    ("w8a8-fp8-channel", 2056, 9, "_token_float32", 9),   # longer rows: a CTA per row
    ("w8a8-int8-channel", 200, 17, "_token_w_", 3),       # element loads (K % 8 != 0), still a warp per row
    ("w8a8-fp8-tensor", 256, 1000, "_tensor_", 1000),     # per tensor: a CTA per row (and the amax pass)
])
def test_per_token_rows_take_a_warp_each_when_short(launches, scheme, k, m, kernel_tag, grid):
    """quantize_activation's launch: per-token scales of rows of at most ROW_WARPS_MAX_VECTORS vectors go to the
    one-warp-per-row kernel (grid ceil(m / 8)); other rows keep one CTA each."""
    x = torch.randn(m, k).bfloat16()
    hg.quantize_activation(x, hg.scheme(scheme).activation)
    name, launched_grid, _ = launches[-1]
    assert name.startswith("act_quantize_") and kernel_tag in name, name
    assert launched_grid[0] == grid, (name, launched_grid)


def test_topk_reduce_launch(launches):
    """The top-k reduction's launch: one CTA per (token, 128 vectors of its row), Params in field order; an `out`
    with 16-byte aligned rows is written in place (its row stride passed), another goes through a temporary."""
    m, top_k, h = 37, 3, 2880
    y = torch.randn(m * top_k, h).bfloat16()
    inverse = torch.arange(m * top_k, dtype=torch.int32)
    buf = torch.empty(m, 4000).bfloat16()
    for out, ldo, direct in ((None, h, False), (buf[:, :h], 4000, True), (buf[:, 8:8 + h], 4000, True),
                             (buf[:, 1:1 + h], h, False)):
        launches.clear()
        got = reduce.topk_reduce(y, inverse, top_k, out, target=TARGET)
        (name, grid, params), = launches
        assert name.startswith("moe_topk_reduce_bfloat16_sm_90a_") and grid == (m, 3, 1), (name, grid)
        ptrs, (ldy, ld, k, vectors) = struct.unpack("<3Q", params[:24]), struct.unpack("<qqii", params[24:])
        assert ptrs[:2] == (y.data_ptr(), inverse.data_ptr()) and (ldy, ld, k, vectors) == (h, ldo, top_k, h // 8)
        assert (ptrs[2] == (got if out is None else out).data_ptr()) == (direct or out is None)
        assert out is None or got is out


def test_topk_reduce_copies_misaligned_rows(launches):
    """Rows the kernel cannot read in 16-byte pieces (a contiguous view 2 bytes into its storage, a row stride that
    is no multiple of 8 elements) reach it as an aligned copy; aligned rows are read in place."""
    m, top_k, h = 4, 2, 64
    inverse = torch.arange(m * top_k, dtype=torch.int32)
    buf = torch.randn(m * top_k * (h + 8) + 8).bfloat16()
    for y, in_place in ((buf[: m * top_k * h].view(m * top_k, h), True),
                        (buf[1:1 + m * top_k * h].view(m * top_k, h), False),
                        (buf[: m * top_k * (h + 1)].view(m * top_k, h + 1)[:, :h], False)):
        launches.clear()
        reduce.topk_reduce(y, inverse, top_k, target=TARGET)
        (_, _, params), = launches
        y_ptr, (ldy,) = struct.unpack("<Q", params[:8])[0], struct.unpack("<q", params[24:32])
        assert y_ptr % 16 == 0 and ldy % 8 == 0 and (y_ptr == y.data_ptr()) == in_place, (y_ptr % 16, ldy)


@pytest.mark.parametrize("m", [1, 5, 37])
@pytest.mark.parametrize("kind", ["token", "static-tensor", "block128", "mxfp8", "int8-g64"])
def test_bound_quantizer_launches_what_quantize_activation_launches(launches, monkeypatch, m, kind):
    """QuantLinear's eager path quantizes through a RowQuantizer bound to the layer (one allocation for codes and
    scales, no checks): the same kernels with the same Params as quantize_activation's path, but for the per-call
    pointers, and the GEMM reads the codes and scales the quantize kernel writes. Per-token, static per-tensor and
    group scales (fp32 groups of 128 and of 64 of int8 codes, e8m0 groups of 32)."""
    static = kind == "static-tensor"
    scheme = {"token": "w8a8-fp8-channel", "static-tensor": "w8a8-fp8-tensor", "block128": "w8a8-fp8-block128",
              "mxfp8": "w8a8-mxfp8",
              "int8-g64": hg.QuantScheme("int8", activation=hg.ActivationScheme("int8", granularity="group",
                                                                                  group_size=64))}[kind]
    scheme = hg.scheme(scheme) if isinstance(scheme, str) else scheme
    qw = scheme.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(2)) * 0.05)
    if static:
        qw = qw.with_input_scale(torch.tensor(0.02)) if hasattr(qw, "with_input_scale") else \
            __import__("attrs").evolve(qw, input_scale=torch.tensor(0.02))
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", dequantize_activations=False)
    (x,) = _inputs("linear", m)
    paths = {}
    layout = layer.kernel_for(m).activation_layout
    for path in ("bound", "general"):
        if path == "general":  # quantize_activation, as for other schemes
            monkeypatch.setattr(layer, "_row_quantizers", {"rows": None, "panels": None})
        launches.clear()
        y = layer(x)
        assert (layer._row_quantizers[layout] is not None) == (path == "bound")
        if path == "bound" and not static:  # the scales after the codes: all m x groups of them in the buffer
            a = layer.activation_scheme
            groups = -(-K // a.group_size) if a.granularity == "group" else 1
            size = 1 if a.scale_dtype.name == "float8e8m0" else 4
            assert layer._row_quantizers[layout].scale_bytes == groups * size, kind
        (q_name, _, q_params), (g_name, _, g_params) = launches
        paths[path] = _named(launches, {x.data_ptr(): "x", y.data_ptr(): "y"})
        q_words = set(struct.unpack(f"<{len(q_params) // 8}Q", q_params))
        kernel = layer.kernel_for(m)
        g_fields = dict(zip([a.name for a in kernel.plan.args], kernel._struct.unpack(g_params)))
        assert g_fields["lda"] == (m * 128 if layout == "panels" else K), (layout, g_fields["lda"])
        written = {g_fields["a"], g_fields["a_scale"]}
        assert written <= q_words, (path, written, q_words)  # codes and scales: what quantize wrote
        if not static:  # codes (m rows of K bytes) and scales apart: neither overwrites the other
            lo, hi = sorted(written)
            assert hi - lo >= m * K, (path, hi - lo)
    assert paths["bound"] == paths["general"]


@pytest.mark.parametrize("m", [1, 5, 37])
def test_moe_bound_quantizers_launch_what_quantize_activation_launches(layers, launches, monkeypatch, m):
    """QuantMoE quantizes both GEMM inputs through RowQuantizers bound on the first call: the same launches (kernels,
    grids, Params but the per-call pointers) as quantize_activation's path, and each GEMM reads the codes and
    scales its quantize kernel wrote."""
    moe = layers["moe", "w8a8-fp8-channel"]
    x, w, ids = _inputs("moe", m)
    paths = {}
    for path in ("bound", "general"):
        if path == "general":
            monkeypatch.setattr(moe, "_row_quantizers", [None, None])
        launches.clear()
        y = moe(x, w, ids)
        assert all((q is not None) == (path == "bound") for q in moe._row_quantizers), path
        paths[path] = _named(launches, {x.data_ptr(): "x", y.data_ptr(): "y"})
        names = [name for name, _, _ in launches]
        quantize = [i for i, name in enumerate(names) if name.startswith("act_quantize")]
        assert len(quantize) == 2, names
        for q in quantize:  # the GEMM after each quantize kernel reads what it wrote (codes, scales)
            q_words = set(struct.unpack(f"<{len(launches[q][2]) // 8}Q", launches[q][2]))
            g_words = set(struct.unpack(f"<{len(launches[q + 1][2]) // 8}Q", launches[q + 1][2]))
            assert len({w for w in q_words & g_words if w >= 1 << 40}) >= 2, (path, names[q + 1])
    assert paths["bound"] == paths["general"]


@pytest.mark.parametrize("m", [1, 37])
@pytest.mark.parametrize("kind", ["mxfp8", "static-tensor"])
def test_dequantized_route_feeds_the_16_bit_gemm_the_values(launches, monkeypatch, m, kind):
    """QuantLinear(dequantize_activations): one quantize kernel in dequantize mode on x's rows, then the 16-bit GEMM
    reading exactly the values it wrote (row stride K), with the layer's static scale where the scheme has one;
    3-d x with strided rows is read in place. The launch bound on the first call (RowQuantizer, "values") launches
    what fake_quantize_activation's general path launches, but for the per-call pointers."""
    from humming_gen.activation.kernel import param_fields, params_struct

    scheme = hg.scheme("w8a8-mxfp8" if kind == "mxfp8" else "w8a8-fp8-tensor")
    qw = scheme.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(3)) * 0.05)
    if kind == "static-tensor":
        qw = __import__("attrs").evolve(qw, input_scale=torch.tensor(0.02))
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu",
                                          dequantize_activations=None if kind == "mxfp8" else True)
    assert layer.value_scheme == scheme.activation
    base = torch.randn(2, m, K + 64, generator=torch.Generator().manual_seed(m)).bfloat16()
    paths = {}
    # one row of stride K + 64 (its stride is never used: the kernels get K), 3-d rows K + 64 apart
    for path, x in (("bound", base[0, :, :K].contiguous()), ("bound", base[:, :, :K]),
                    ("general", base[0, :, :K].contiguous())):
        if path == "general":
            monkeypatch.setitem(layer._row_quantizers, "values", None)
        launches.clear()
        y = layer(x)
        assert (layer._row_quantizers["values"] is not None) == (path == "bound")
        if x.dim() == 2:
            paths[path] = _named(launches, {x.data_ptr(): "x", y.data_ptr(): "y"})
        assert y.shape == (*x.shape[:-1], N)
        (q_name, _, q_params), (g_name, _, g_params) = launches
        assert "_dq_bfloat16_" in q_name and "gemm_" in g_name, (q_name, g_name)
        plan = api._plans[next(k for k in api._plans if k[-1] == "bfloat16")]
        fields = [f[0] for f in param_fields(plan.config)]
        q = dict(zip(fields, params_struct(plan.config).unpack(q_params)))
        kernel = layer.kernel_for(x.numel() // K)
        g = dict(zip([a.name for a in kernel.plan.args], kernel._struct.unpack(g_params)))
        rows = x.numel() // K
        assert q["x"] == x.data_ptr() and q["ldx"] == (K + 64 if rows > 1 and x.dim() == 3 else K) and q["m"] == rows
        assert q["k"] == K and q["ldq"] == 2 * K and g["a"] == q["codes"] and g["lda"] == K
        if kind == "static-tensor":
            assert q["tensor_scale"] == layer._static_scale.data_ptr()
            assert float(layer._static_scale.reshape(())) == pytest.approx(0.02)
    assert paths["bound"] == paths["general"]


def test_dequantized_route_host_path_structure(launches):
    """An eager forward of the values route (w8a8-mxfp8 on sm_90a): two launches (values, 16-bit GEMM), the output,
    values and scales allocated (a view of the values), no config built, a budget of Python calls (today 31, the
    8-bit route 27: both through a bound quantize launch)."""
    qw = hg.scheme("w8a8-mxfp8").quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(4)) * 0.05)
    layer = hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu")
    assert layer.value_scheme is not None
    (x,) = _inputs("linear")
    layer(x)
    launches.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        layer(x)
    assert len(launches) == 2 and "_dq_bfloat16_" in launches[0][0], [name for name, _, _ in launches]
    ops = Counter(e.name for e in prof.events() if e.cpu_parent is None and e.name not in CPU_ONLY)
    assert not ops - Counter({"aten::empty": 3, "aten::view": 1}), dict(ops)
    calls = _python_calls(lambda: layer(x))
    assert not [n for n in calls if any(w in n for w in ("Config.__init__", "compose", "evolve", "build"))]
    assert sum(calls.values()) <= 42, calls.most_common(15)
