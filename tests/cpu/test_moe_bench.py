"""bench/moe_bench.py without a GPU: the dry run (plan, token tiles, anchor tables, JSON), the embedded anchors
against the anchor files, and the timed code paths on a tiny CPU layer built for sm_90a with the kernel launches
and the timers stubbed (every argument our MoE ops check, the grouped kernels composed and compiled, the bf16
torch MoE and the float64 references computed for real)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import gated_tile_rows

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "moe_bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("moe_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_prints_the_plan_and_anchor_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HUMMING_GEN_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "plan gptoss w4a16-mxfp4: token tiles on sm_90a" in result.stderr
    assert "| gate-up 5760x2880 | 1 |" in result.stdout and "| 23.8 |" in result.stdout  # Humming's anchor
    data = json.loads((tmp_path / "moe_bench.json").read_text())
    assert data["schema"] == "humming_gen.moe_bench/1" and len(data["anchors"]) == 14
    bad = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--models", "llama"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "--models: unknown ['llama']" in bad.stderr


def test_embedded_anchors_match_the_anchor_files():
    mb = load_bench()
    folder = Path("/work/shared/anchors")
    if not (folder / "h200_moe_graph.json").is_file():
        pytest.skip("no anchor files here")
    from_files, source = mb.load_anchors(str(folder))
    assert source == str(folder)
    for key, value in mb.ANCHORS.items():
        assert from_files[key] == value, key


def test_cat_experts_keeps_one_byte_float_scales():
    mb = load_bench()
    parts = [torch.tensor([[1.0, 2.0]]).to(torch.float8_e8m0fnu), torch.tensor([[0.5, 4.0]]).to(torch.float8_e8m0fnu)]
    out = mb.cat_experts(parts)
    assert out.dtype == torch.float8_e8m0fnu and out.float().tolist() == [[1.0, 2.0], [0.5, 4.0]]


def emulate_moe_launches(monkeypatch) -> list[str]:
    """Replace the MoE kernels' launches by torch on the dequantized experts (what the GPU tests check the kernels
    against; a fused GEMM1 applies the gated activation to its rows in tile order), so the benchmark's own float64
    checks must come out small; returns the gemm type of each launch."""
    import humming_gen as hg
    from humming_gen.kernel import Launcher
    from humming_gen.layer.gate_up import gate_up_tile_order

    experts: dict[int, torch.Tensor] = {}  # id(PreparedWeight) -> dequantized (E, N, K)
    build = hg.QuantMoE.from_quantized.__func__

    def from_quantized(cls, q13, q2, **kwargs):
        layer = build(cls, q13, q2, **kwargs)
        w13 = q13.dequantize()
        if layer.fused_activation:  # packed in tile order, as the layer's bias13
            w13 = w13[:, gate_up_tile_order(layer.intermediate, layer.gate_up_layout)]
        experts[id(layer.w13)], experts[id(layer.w2)] = w13, q2.dequantize()
        return layer

    def product(self, a: torch.Tensor, e: int) -> torch.Tensor:
        y = a.float() @ experts[id(self.weight)][e].T
        return y if self.bias is None else y + self.bias[e].float()

    def moe(self, a, out, routing, top_k, topk_weights=None, a_scale=None):
        assert a_scale is None, "16-bit activations only here"
        launches.append(self.kernel.plan.compute.gemm)
        bm = self.kernel.plan.tuning.block_m
        for block in range(int(routing.num_tokens_post_pad) // bm):
            rows = routing.sorted_ids[block * bm:(block + 1) * bm].long()
            rows = rows[rows < out.shape[0]]
            y = product(self, a[rows // top_k], int(routing.expert_ids[block]))
            if self.kernel.plan.compute.epilogue_activation:
                y = gated_tile_rows(y, self.kernel.plan.compute.epilogue_activation)
            out[rows] = (y if topk_weights is None else y * topk_weights[rows, None]).to(out.dtype)

    def grouped(self, a, out, expert_layout, a_scale=None):
        assert a_scale is None, "16-bit activations only here"
        launches.append(self.kernel.plan.compute.gemm)
        for e in range(expert_layout.numel() - 1):
            start, end = int(expert_layout[e]), int(expert_layout[e + 1])
            out[start:end] = product(self, a[start:end], e).to(out.dtype)

    launches: list[str] = []
    monkeypatch.setattr(hg.QuantMoE, "from_quantized", classmethod(from_quantized))
    monkeypatch.setattr(Launcher, "moe", moe)
    monkeypatch.setattr(Launcher, "grouped", grouped)
    return launches


@pytest.mark.parametrize("unfused", [False, True], ids=["default", "unfused-activation"])
def test_timed_paths_on_a_tiny_cpu_layer(unfused, monkeypatch, tmp_path):
    """By default the layer fuses its swiglu into GEMM1, whose gate-up cells are then skipped (with the reason);
    --unfused-activation times that GEMM alone too."""
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path / "cache"))
    mb = load_bench()
    import humming_gen.bench.timing as timing

    launches = emulate_moe_launches(monkeypatch)
    monkeypatch.setattr(timing, "graph_time_us", lambda fns, x, replays=20: [f(x) for f in fns] and 1.0)
    monkeypatch.setattr(timing, "eager_time_us", lambda fns, x, calls=200: 2.0)
    tiny = mb.Model("tiny gpt-oss", 8, 2, 256, 128, "swiglu_oai", "interleaved", True,
                    {"w13": (1, 16), "w2": (1, 16), "layer": (1, 16)}, ("w4a16-mxfp4",), "none.json")
    monkeypatch.setitem(mb.MODELS, "tiny", tiny)
    args = mb.parse_args(["--models", "tiny", "--layers", "2", "--humming", "grouped,indexed"]
                         + ["--unfused-activation"] * unfused)
    entry = mb.plan(args)[0]
    results = mb.new_results(args, [entry])
    bench = mb.Bench(args, results, device="cpu", target="sm_90a")
    batches = {m: mb.make_batch(tiny, m, seed=m, device="cpu") for m in (1, 16)}
    monkeypatch.setattr(mb.torch.cuda, "empty_cache", lambda: None)
    bench.run_ours("tiny", entry, "w4a16-mxfp4", batches)
    bench.run_humming("tiny", entry, "w4a16-mxfp4", batches)  # skips with the reason where humming is absent
    bench.run_torch("tiny", entry, batches)

    rows = results["rows"]
    errors = [(r["impl"], r.get("gemm"), r["m"], r["error"]) for r in rows if r.get("error")]
    assert not errors, errors
    impls = {(r["impl"], r.get("gemm"), r["m"]) for r in rows}
    gemms = ("w13", "w2") if unfused else ("w2",)
    assert {gemm for _, gemm, _ in impls if gemm} == set(gemms)
    for gemm in gemms:
        for m in (1, 16):
            for impl in ("grouped", "indexed", "align+indexed", "align"):
                assert (impl, gemm, m) in impls
    assert {"grouped_contiguous", "indexed"} <= set(launches)
    checked = [(r["impl"], r.get("gemm"), r["m"], r["rel_err"]) for r in rows if r.get("rel_err") is not None]
    assert len(checked) == 4 * len(gemms) + 2 and all(err < 1e-2 for *_, err in checked), checked
    layer_rows = [r for r in rows if r["table"] == "layer"]
    assert {(r["impl"], r["m"]) for r in layer_rows} == {(f, m) for f in ("w4a16-mxfp4", "torch-bf16") for m in (1, 16)}
    assert all(r["fused_activation"] is not unfused for r in layer_rows if r["impl"] == "w4a16-mxfp4")
    skipped = [s for s in results["skipped"] if s["what"] == "gate-up GEMM alone"]
    assert len(skipped) == (0 if unfused else 1)
    floor = next(r for r in layer_rows if r["impl"] == "torch-bf16" and r["m"] == 1)
    assert floor["rel_err"] < 1e-2 and "grouped_mm" in floor["method"]  # bf16 torch MoE against float64, for real
    table = mb.format_tables(results)
    assert "| gate-up 256x256 | 16 |" in table and "whole MoE layer" in table
    assert ("gate-up GEMM alone: the layer applies the gated activation" in table) is not unfused
    if importlib.util.find_spec("humming") is None:
        assert any(s["what"].startswith("Humming") for s in results["skipped"])


def test_torch_moe_loop_matches_grouped_mm():
    mb = load_bench()
    tiny = mb.Model("tiny", 6, 3, 64, 32, "silu_mul", "split", False, {}, (), "none.json")
    torch.manual_seed(0)
    w13 = (torch.randn(6, 64, 64) * 0.1).bfloat16()
    w2 = (torch.randn(6, 64, 32) * 0.1).bfloat16()
    b = mb.make_batch(tiny, 10, seed=3, device="cpu")
    grouped = mb.TorchMoE(tiny, w13, w2)(b.x, b.weights, b.ids)
    looped = mb.TorchMoE(tiny, w13, w2, loop=True)(b.x, b.weights, b.ids)
    ref = mb.reference_layer(tiny, b, lambda e: w13[e], lambda e: w2[e])
    assert torch.equal(grouped, looped)
    assert ((grouped.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_alternating_graph_times_take_each_candidates_best_round(monkeypatch) -> None:
    """The sweeps' timer: candidates in turn each round, each one's best round reported in candidate order."""
    import humming_gen.bench.timing as timing

    calls = []
    samples = iter([5.0, 9.0, 3.0, 4.0, 8.0, 6.0])  # round 1: a, b, c; round 2: a, b, c

    def fake(fns, x):
        calls.append(fns[0])
        return next(samples)

    monkeypatch.setattr(timing, "graph_time_us", fake)
    got = timing.alternating_graph_times([["a"], ["b"], ["c"]], torch.zeros(1))
    assert calls == ["a", "b", "c", "a", "b", "c"]
    assert got == [4.0, 8.0, 3.0]
