"""The panels layout of 8-bit activation codes (quantize_activation(layout="panels"), QuantizedActivation layout
"panels"), which the warp-specialized 8-bit GEMMs copy a stage of in one bulk copy (TuningConfig.a_load='tma'):
the reference unswizzle against an independent model of the layout, the quantize kernels that write it (source,
NVRTC for every 8-bit target), the GEMMs that read it (the heuristics' choice, the ring's barrier counts, refusals)
and the launcher's refusal of the other layout. The GPU tests check the kernels' bytes (test_quantize_activation,
test_linear_w8a8.test_a8_panels_equal_row_codes)."""

from __future__ import annotations

import re

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.activation.kernel import QuantizeConfig, build, generate
from humming_gen.codegen.compose import ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings
from humming_gen.kernel import generate as generate_gemm
from humming_gen.schemes.quantize import QuantizedActivation
from humming_gen.schemes.scheme import ActivationScheme as A
from humming_gen.targets import get_target

SM90 = get_target("sm_90a")


def _panels_model(codes: torch.Tensor) -> torch.Tensor:
    """(M, K) codes into (K / 128, M, 128) panels, byte by byte as the layout is specified: column c of row r in
    panel c // 128, 16-byte chunk (c % 128) // 16 stored at chunk ((c % 128) // 16) ^ (r % 8)."""
    m, k = codes.shape
    out = torch.zeros(k // 128, m, 128, dtype=torch.uint8)
    for r in range(m):
        for c in range(k):
            chunk = (c % 128) // 16
            out[c // 128, r, 16 * (chunk ^ (r % 8)) + c % 16] = codes[r, c]
    return out


@pytest.mark.parametrize("m,k", [(1, 128), (3, 256), (9, 384), (17, 128)])
def test_to_reference_unswizzles_panels(m: int, k: int) -> None:
    codes = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(m * k))
    scales = torch.rand(m, 1)
    qa = QuantizedActivation(A("float8e4m3"), _panels_model(codes), scales, layout="panels")
    assert torch.equal(qa.to_reference().codes, codes)


def _codes_at_model(ldq: int, row: int, col: int) -> int:
    return (col // 128) * ldq + row * 128 + 16 * (((col // 16) % 8) ^ (row % 8)) + col % 16


def test_kernel_address_formula_is_the_layout() -> None:
    """The generated codes_at (shifts and masks) evaluated in Python over a grid of rows and columns lands every
    code where the layout model puts it."""
    src = generate(QuantizeConfig(A("float8e4m3"), "bfloat16", SM90, panels=True))
    body = re.search(r"codes_at\(unsigned char\* codes, long long ldq, long long row, long long col\) \{\s*return "
                     r"codes \+ (.*?);\s*\}", src, re.S).group(1)
    expr = body.replace(">>", "//2**").replace("<<", "*2**")
    m = 11
    for row in range(m):
        for col in range(0, 512, 8):
            got = eval(expr, {"ldq": m * 128, "row": row, "col": col})  # noqa: S307 (our own generated text)
            assert got == _codes_at_model(m * 128, row, col), (row, col, body)


KINDS = {"rows": (A("float8e4m3"), 8192), "row_warps": (A("int8"), 2048), "tensor-static": (A("float8e5m2",
         granularity="tensor"), 4096), "group-lanes": (A("float8e4m3", granularity="group", group_size=128), 4096),
         "group-threads": (A("int8", granularity="group", group_size=64, scale_dtype="bfloat16"), 4096),
         "mxfp8": (A("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0"), 4096)}


@pytest.mark.parametrize("target", ["sm_89", "sm_90a", "sm_100a", "sm_120a"])
def test_panels_quantize_kernels_compile(target: str) -> None:
    """Every kernel strategy with panels stores through codes_at (and only then), and compiles with NVRTC."""
    tgt = get_target(target)
    for kind, (scheme, _) in KINDS.items():
        cfg = QuantizeConfig(scheme, "bfloat16", tgt, static=kind == "tensor-static", row_warps=kind == "row_warps",
                             panels=True)
        src = generate(cfg)
        assert "codes_at(p.codes, p.ldq, row, col)" in src and "row * p.ldq" not in src, kind
        assert "codes_at" not in generate(attrs.evolve(cfg, panels=False)), kind
        assert cfg.key() != attrs.evolve(cfg, panels=False).key() and cfg.kernel_name.count("_p_") == 1
        kernel = build(cfg, compiler="nvrtc")
        assert kernel.compiled is not None, kind


def test_panels_need_8bit_codes() -> None:
    with pytest.raises(ValueError, match="panels"):
        QuantizeConfig(A("int4"), "bfloat16", SM90, panels=True)


def _plan(fmt: str, n: int = 8192, k: int = 8192):
    layer = LayerConfig(n=n, k=k, scheme=hg.scheme(fmt))
    return layer, choose_tunings(layer, SM90, stored=False)


@pytest.mark.parametrize("fmt", ["w8a8-fp8-channel", "w8a8-int8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8",
                                 "w8a8-mxfp8"])
def test_dense_a8_buckets_bulk_copy_panels(fmt: str) -> None:
    """Every sm_90a bucket of a dense 8-bit layer with K % 128 == 0 reads panels: one bulk copy of the stage's codes
    whose bytes the first producer thread's expect_tx counts; the full barrier waits for that thread alone unless
    the producer also stages activation scales by cp.async (fp32 groups, MXFP8's e8m0 bytes), then for every
    producer thread."""
    layer, plan = _plan(fmt)
    staged = fmt in ("w8a8-fp8-block128", "w8a8-mxfp8")
    for m_max, t in plan.buckets:
        assert t.a_load == "tma", (m_max, t)
        assert t.raster == ("m_band" if t.split_k == 1 and not (fmt == "w4a8-mxfp4-fp8" and t.block_m > 128)
                            else "n_major"), (m_max, t)
        kp = compose(layer, ComputeConfig(), t, SM90)
        src = generate_gemm(kp)
        assert "_pa" in kp.kernel_name.split("_ws_")[1] and "bulk_copy(a_smem_stage" in src and "cp_async_16" not in src
        assert "weight_stage_bytes(tc.n0) + a_stage_bytes(p.m, tc.m0)" in src
        count = "cfg::kProducerThreads + 1" if staged else "1"
        assert f"mbarrier_init(ring.full_bars + 8 * s, {count});" in src, (m_max, fmt)
        assert ("cp_async_arrive_noinc(full)" in src) == staged and ("cp_async_drain()" in src) == staged
        assert "panel stride of a, bytes" in src


def test_row_codes_where_k_is_not_whole_panels() -> None:
    layer, plan = _plan("w8a8-fp8-channel", n=4000, k=3000)
    assert all(t.a_load == "cp_async" for _, t in plan.buckets)
    t = attrs.evolve(plan.for_m(1), a_load="tma")
    with pytest.raises(ComposeError, match="K a multiple of 128"):
        compose(layer, ComputeConfig(), t, SM90)


def test_panels_refused_for_moe_and_256k_stages() -> None:
    layer = LayerConfig(n=1024, k=2048, scheme=hg.scheme("w8a8-fp8-channel"), num_experts=8)
    from humming_gen.pipelines.warp_specialized.heuristics import choose_moe_tunings

    t = attrs.evolve(choose_moe_tunings(layer, SM90).for_m(10 ** 6), a_load="tma")
    with pytest.raises(ComposeError, match="MoE kernels read rows"):
        compose(layer, ComputeConfig(gemm="indexed"), t, SM90)
    dense, plan = _plan("w8a8-fp8-channel", n=1024, k=2048)
    with pytest.raises(ComposeError, match="one 128-k panel per stage"):
        compose(dense, ComputeConfig(), attrs.evolve(plan.for_m(10 ** 6), block_k=256, stages=2), SM90)


CXX = __import__("shutil").which("g++")


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("block_m", [16, 128, 192])
def test_multicast_halves_cover_the_tile_rows_once(block_m: int, tmp_path) -> None:
    """cluster_n=2: the two CTAs' halves of a stage (ATilePanelsBulk(multicast=True), compiled for the host with
    the copy and the CTA rank stubbed) are disjoint, cover the tile's rows below m exactly, read the rows they
    write, and sum to a_stage_bytes, the bytes each CTA's full barrier expects."""
    import subprocess

    from humming_gen.codegen.render import environment
    from humming_gen.pipelines.warp_specialized.components import ATilePanelsBulk

    comp = ATilePanelsBulk(dtype="float8e4m3", multicast=True)
    body = environment().get_template(comp.template).render(**comp.context())
    prelude = ("#include <cstdio>\n#include <algorithm>\nusing std::min; using std::max;\ntypedef unsigned u32;\n"
               "#define __device__\n#define __forceinline__ inline\n"
               f"namespace cfg {{ constexpr int kBlockM = {block_m}; constexpr int kBlockK = 128; }}\n"
               "static int g_rank = 0;\ninline int cluster_cta_rank() { return g_rank; }\n"
               "inline void bulk_copy_multicast(u32 dst, const void* src, int bytes, u32, unsigned short mask) {\n"
               "  printf(\"%d %u %ld %d %d\\n\", g_rank, dst, (long)src, bytes, (int)mask);\n}\n")
    main = ("int main() {\n  const int ms[] = {1, 7, 8, 9, 100, 191, 192, 193, 700};\n"
            "  for (int m : ms) for (int m0 = 0; m0 < m; m0 += cfg::kBlockM) {\n"
            "    printf(\"tile %d %d %d\\n\", m, m0, a_stage_bytes(m, m0));\n"
            "    for (g_rank = 0; g_rank < 2; ++g_rank) load_a_stage(0, nullptr, 1 << 20, m, m0, 0, 0);\n"
            "  }\n  return 0;\n}\n")
    src = tmp_path / "a.cpp"
    src.write_text(prelude + body.replace("__device__ __forceinline__", "inline") + main)
    exe = tmp_path / "a"
    subprocess.run([CXX, "-std=c++17", "-o", str(exe), str(src)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    tiles = 0
    for i, line in enumerate(out):
        if not line.startswith("tile"):
            continue
        tiles += 1
        _, m, m0, expected = line.split()
        m, m0, expected = int(m), int(m0), int(expected)
        copies = []
        for nxt in out[i + 1:]:
            if not nxt or nxt.startswith("tile"):
                break
            rank, dst, src_addr, nbytes, mask = (int(v) for v in nxt.split())
            assert mask == 3 and nbytes > 0 and dst % 1024 == 0  # both CTAs, whole 8-row swizzle atoms
            assert src_addr == m0 * 128 + dst  # the rows it writes are the rows it reads
            copies.append((dst, dst + nbytes))
        rows = min(block_m, m - m0)
        assert expected == rows * 128
        covered = sorted(copies)
        assert sum(b - a for a, b in covered) == expected and covered[0][0] == 0 if covered else expected == 0
        assert all(a[1] <= b[0] for a, b in zip(covered, covered[1:]))  # disjoint
        assert not covered or covered[-1][1] == expected  # contiguous from 0: the rows below m
    assert tiles > 0
