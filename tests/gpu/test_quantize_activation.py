"""humming_gen.quantize_activation on the GPU against ActivationScheme.quantize (CPU, float64): codes and scales bit
for bit, for every scheme kind and kernel strategy, fresh random inputs with outliers, outputs poisoned first."""

from __future__ import annotations

import math

import pytest
import torch

import humming_gen as hg
from humming_gen.schemes.scheme import ActivationScheme as A

pytestmark = pytest.mark.gpu

SCHEMES = {
    "fp8e4m3-token": A("float8e4m3"),
    "fp8e5m2-token": A("float8e5m2"),
    "int8-token": A("int8"),
    "int4-token": A("int4"),
    "fp8e4m3-g128": A("float8e4m3", granularity="group", group_size=128),
    "fp8e4m3-g32": A("float8e4m3", granularity="group", group_size=32),
    "fp8e4m3-g100": A("float8e4m3", granularity="group", group_size=100),
    "int8-g64-bf16scale": A("int8", granularity="group", group_size=64, scale_dtype="bfloat16"),
    "int4-g32": A("int4", granularity="group", group_size=32),
    "fp8e4m3-tensor": A("float8e4m3", granularity="tensor"),
    "fp8e5m2-g128": A("float8e5m2", granularity="group", group_size=128),
    "fp8e5m2-tensor": A("float8e5m2", granularity="tensor"),
    "int8-tensor": A("int8", granularity="tensor"),
    "mxfp8-rceil": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0"),
    "mxfp8-floor": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0", scale_rule="floor"),
    "mxfp8-even": A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0", scale_rule="even"),
    "nvfp4": A("float4e2m1", granularity="group", group_size=16, scale_dtype="float8e4m3", global_scale=True),
}


def _poison_allocator(device: torch.device, nbytes: int = 64 << 20) -> None:
    """Fill the caching allocator's free blocks with 0xAB, so outputs that a kernel leaves unwritten show."""
    junk = torch.full((nbytes,), 0xAB, dtype=torch.uint8, device=device)
    del junk


def _random(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 10.0 ** torch.randint(-3, 3, (m, 1), generator=g).float()
    outliers = torch.rand(m, k, generator=g) < 0.002
    x = torch.where(outliers, x * 60.0, x)
    x[m // 2, : k // 3] = 0.0  # a block of zeros
    return x.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN (a NaN block's scale is NaN in both)."""
    a, b = a.to(torch.float32), b.to(torch.float32)
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _check(got: hg.QuantizedActivation, x: torch.Tensor, scheme: A, static_scale=None) -> None:
    from humming_gen.schemes.quantize import quantize_activation as reference

    want = reference(scheme, x.cpu(), None if static_scale is None else static_scale.cpu())
    ref = got.to_reference()
    codes = ref.codes.cpu()
    assert codes.shape == want.codes.shape
    bad = (codes != want.codes).nonzero()
    assert bad.numel() == 0, (f"{bad.shape[0]} codes differ, first at {bad[0].tolist()}: got "
                              f"{int(codes[tuple(bad[0])])}, want {int(want.codes[tuple(bad[0])])}, "
                              f"x={float(x.cpu()[tuple(bad[0])])}")
    assert _same(ref.scales.cpu(), want.scales), f"scales differ: {ref.scales.cpu()} vs {want.scales}"
    if want.global_scale is not None:
        assert _same(ref.global_scale.cpu().reshape(()), want.global_scale.reshape(()))


@pytest.mark.parametrize("m", [1, 3, 127])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_matches_reference(name, m):
    scheme = SCHEMES[name]
    k = 3200 if scheme.granularity == "group" and scheme.group_size == 100 else 4096
    x = _random(m, k, torch.bfloat16, seed=m * 7 + len(name)).cuda()
    _poison_allocator(x.device)
    got = hg.quantize_activation(x, scheme)
    torch.cuda.synchronize()
    _check(got, x, scheme)


@pytest.mark.parametrize("k", [256, 200, 2048, 2056])
@pytest.mark.parametrize("m", [1, 3, 127, 1000])
@pytest.mark.parametrize("name", ["fp8e4m3-token", "fp8e5m2-token", "int8-token", "int4-token", "fp8e4m3-tensor",
                                  "nvfp4"])
def test_short_rows_match_reference(name, m, k):
    """Per-token rows of at most 256 vectors (K <= 2048 with 16-byte loads; K = 200 takes element loads) take one
    warp each; K = 2056 is the first that keeps a CTA per row. The amax pass of a dynamic per-tensor or global scale
    walks rows a warp each whatever K."""
    scheme = SCHEMES[name]
    x = _random(m, k, torch.bfloat16, seed=m * 11 + k).cuda()
    _poison_allocator(x.device)
    got = hg.quantize_activation(x, scheme)
    torch.cuda.synchronize()
    _check(got, x, scheme)


@pytest.mark.parametrize("k,layout", [(k, layout) for k in (4096, 8192, 8320, 20480) for layout in ("rows", "panels")]
                         + [(2050, "rows")])  # (the panels layout needs K a multiple of 128)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", ["fp8e4m3-token", "int8-token", "fp8e4m3-tensor"])
def test_long_rows_held_and_read_again(name, dtype, k, layout):
    """A CTA-per-row thread loads its first kHeldVectors vectors at once and holds them through the amax; vectors past
    them (K above 8192 bf16 / 4096 fp32 at 256 threads, and above 1024 elements with element loads: K = 2050) are
    read in both passes. Each row's amax sits at its own vector, (257 r) mod the row's vectors, so the rows cover
    every held slot and the re-read part; a pass that skips any of them changes a scale."""
    scheme = SCHEMES[name]
    x = _random(37, k, torch.float32, seed=k + len(name))
    vector = 1 if k * dtype.itemsize % 16 else 16 // dtype.itemsize  # element loads, or 16 bytes
    vectors = -(-k // vector)
    for r in range(x.shape[0]):
        x[r, ((257 * r) % vectors) * vector] = 1e4 * (-1) ** r
    x = x.to(dtype).cuda()
    _poison_allocator(x.device)
    _check(hg.quantize_activation(x, scheme, layout=layout), x, scheme)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("name", ["fp8e4m3-token", "fp8e4m3-g128", "mxfp8-rceil", "nvfp4", "int8-tensor"])
def test_other_input_dtypes(name, dtype):
    scheme = SCHEMES[name]
    x = _random(64, 2048, dtype, seed=5).cuda()
    _poison_allocator(x.device)
    _check(hg.quantize_activation(x, scheme), x, scheme)


def _near_midpoints(scheme: A, k: int, seed: int) -> torch.Tensor:
    """fp32 rows whose quotients by their scale lie within 7 fp32 ulps of the element's rounding midpoints, on both
    sides and on them (up to the fp32 rounding of x): where the kernels take the exact division instead of x times
    the scale's reciprocal (activation ElementCode.near), beside cases just past its margin. Each row keeps its amax
    element, so its scale is the reference's for that amax (per group: every group's first element)."""
    from humming_gen.schemes.quantize import quantize_activation as reference

    g = torch.Generator().manual_seed(seed)
    fmt = scheme.dtype
    values = sorted({v for v in fmt.decode(torch.arange(1 << (fmt.bits - 1))).tolist() if math.isfinite(v)})
    midpoints = torch.tensor([(a + b) / 2 for a, b in zip(values, values[1:])], dtype=torch.float64)
    rows = []
    for amax in (3.0, 0.37, 1234.5):
        row = torch.zeros(k, dtype=torch.float32)
        step = scheme.group_size if scheme.granularity == "group" else k
        row[::step] = amax
        scale = float(reference(scheme, row[None], None).scales.reshape(-1)[0].to(torch.float64))
        near = (midpoints[torch.randint(len(midpoints), (k,), generator=g)] * scale).to(torch.float32)
        near = (near.view(torch.int32) + torch.randint(-7, 8, (k,), generator=g, dtype=torch.int32)).view(torch.float32)
        near = torch.minimum(near, torch.tensor(amax)) * (1 - 2 * torch.randint(0, 2, (k,), generator=g))
        rows.append(torch.where(row == amax, row, near))
    return torch.stack(rows)


@pytest.mark.parametrize("name", ["fp8e4m3-token", "fp8e5m2-token", "fp8e4m3-g128", "mxfp8-rceil"])
def test_quotients_near_rounding_midpoints(name):
    """Codes of quotients within a few ulps of the element's rounding midpoints, bit for bit as the reference's."""
    scheme = SCHEMES[name]
    x = _near_midpoints(scheme, 4096, seed=len(name)).cuda()
    _poison_allocator(x.device)
    _check(hg.quantize_activation(x, scheme), x, scheme)
    _check(hg.quantize_activation(x, scheme, layout="panels"), x, scheme)


@pytest.mark.parametrize("name", ["fp8e4m3-token", "fp8e5m2-token", "fp8e4m3-g32", "fp8e5m2-g128", "nvfp4"])
def test_software_rounding_on_the_device(name):
    """The software path the targets without a cvt instruction run, on this device."""
    scheme = SCHEMES[name]
    x = _random(33, 1024, torch.bfloat16, seed=11).cuda()
    _poison_allocator(x.device)
    _check(hg.quantize_activation(x, scheme, hardware_convert=False), x, scheme)


@pytest.mark.parametrize("name", ["fp8e4m3-token", "fp8e4m3-g32", "fp8e4m3-g100", "int4-g32", "nvfp4",
                                  "fp8e4m3-tensor"])
def test_unaligned_and_row_strided_inputs(name):
    """Element loads: a pointer off 16 bytes, K not a multiple of the vector, a row stride beyond K, 3-D input."""
    scheme = SCHEMES[name]
    base = _random(40, 1000 + 2 + 64, torch.bfloat16, seed=3).cuda()
    k = 1000 if not (scheme.granularity == "group" and scheme.group_size == 100) else 900
    x = base[:, 2:2 + k]  # row stride 1066, pointer 4 bytes off
    _poison_allocator(x.device)
    _check(hg.quantize_activation(x, scheme), x, scheme)
    x3 = _random(6, 7 * 512, torch.bfloat16, seed=4).cuda().reshape(6, 7, 512)
    _check(hg.quantize_activation(x3, scheme), x3, scheme)


def test_partial_last_group():
    scheme = A("float8e4m3", granularity="group", group_size=128)
    x = _random(5, 1000, torch.bfloat16, seed=9).cuda()  # 7 groups, the last of 104 elements
    _check(hg.quantize_activation(x, scheme), x, scheme)


@pytest.mark.parametrize("name", ["fp8e4m3-tensor", "fp8e5m2-tensor", "int8-tensor", "nvfp4"])
def test_static_scale(name):
    scheme = SCHEMES[name]
    x = _random(17, 2048, torch.bfloat16, seed=13).cuda()
    static = torch.tensor([0.0123], dtype=torch.float32, device="cuda")
    _poison_allocator(x.device)
    got = hg.quantize_activation(x, scheme, static_scale=static)
    _check(got, x, scheme, static_scale=static)


def test_nan_and_inf_rows_follow_the_reference():
    x = _random(8, 512, torch.bfloat16, seed=21).cuda()
    x[1, 7] = math.nan
    x[2, 9] = math.inf
    for name in ("fp8e4m3-token", "int8-token", "mxfp8-rceil", "fp8e5m2-token"):
        _check(hg.quantize_activation(x, SCHEMES[name]), x, SCHEMES[name])


@pytest.mark.parametrize("name", ["fp8e4m3-token", "fp8e4m3-tensor", "nvfp4"])
def test_cuda_graph_capture(name):
    scheme = SCHEMES[name]
    x = _random(16, 2048, torch.bfloat16, seed=1).cuda()
    hg.quantize_activation(x, scheme)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = hg.quantize_activation(x, scheme)
    for seed in (2, 3):
        x.copy_(_random(16, 2048, torch.bfloat16, seed=seed).cuda())
        graph.replay()
        torch.cuda.synchronize()
        _check(out, x, scheme)


def test_bad_input_is_refused_before_launch():
    scheme = SCHEMES["fp8e4m3-token"]
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x.dtype"):
        hg.quantize_activation(x.to(torch.int32), scheme)
    with pytest.raises(ValueError, match="at least 2 dims"):
        hg.quantize_activation(x[0], scheme)
    with pytest.raises(ValueError, match="CUDA"):
        hg.quantize_activation(x.cpu(), scheme)
    with pytest.raises(ValueError, match="unit stride"):
        hg.quantize_activation(x.t(), scheme)
    with pytest.raises(ValueError, match="K must be even"):
        hg.quantize_activation(x[:, :63], SCHEMES["int4-token"])
    with pytest.raises(ValueError, match="static scale needs"):
        hg.quantize_activation(x, scheme, static_scale=torch.ones(1, device="cuda"))


PANEL_SCHEMES = ["fp8e4m3-token", "fp8e5m2-token", "int8-token", "fp8e4m3-g128", "fp8e4m3-g32", "fp8e4m3-tensor",
                 "int8-g64-bf16scale", "mxfp8-rceil"]


@pytest.mark.parametrize("k", [128, 2048, 4096, 7168])
@pytest.mark.parametrize("m", [1, 3, 8, 37, 1000])
@pytest.mark.parametrize("name", PANEL_SCHEMES)
def test_panels_layout_matches_reference(name, m, k):
    """layout='panels' (what the warp-specialized 8-bit GEMMs bulk-copy): every code in its swizzled panel place,
    bit for bit the reference's (to_reference unswizzles); every byte of the (K / 128, M, 128) tensor written (the
    allocator poisoned first, so a byte left out shows as 0xAB); per-token rows of both kernel strategies (K = 2048
    one warp per row, K >= 4096 a CTA per row) and both group strategies."""
    scheme = SCHEMES[name]
    x = _random(m, k, torch.bfloat16, seed=m * 13 + k).cuda()
    _poison_allocator(x.device)
    got = hg.quantize_activation(x, scheme, layout="panels")
    torch.cuda.synchronize()
    assert got.layout == "panels" and got.codes.shape == (k // 128, m, 128) and got.codes.is_contiguous()
    _check(got, x, scheme)
    rows = hg.quantize_activation(x, scheme)
    assert torch.equal(got.to_reference().codes, rows.to_reference().codes)


def test_panels_layout_static_scale_and_refusals():
    scheme = SCHEMES["fp8e4m3-tensor"]
    x = _random(5, 1024, torch.bfloat16, seed=2).cuda()
    static = torch.tensor([0.5], device="cuda")
    _check(hg.quantize_activation(x, scheme, static, layout="panels"), x, scheme, static)
    for bad, what in ((x[:, :1000], "K a multiple of 128"), (x.reshape(5, 8, 128), r"takes \(M, K\) activations")):
        with pytest.raises(ValueError, match=what):
            hg.quantize_activation(bad, scheme, layout="panels")
    with pytest.raises(ValueError, match="8-bit codes"):
        hg.quantize_activation(x, SCHEMES["int4-token"], layout="panels")
