"""On the GPU: a tiny autotune end to end (timing, store, QuantLinear picking the stored tunings up, correct
results), and batch invariance: a row computed alone, in a batch of 33, 700 or 4096 rows, or beside other rows, is
bitwise the same."""

from __future__ import annotations

import pytest
import torch

import humming_gen as hg
from humming_gen.heuristics import choose_tunings, heuristic_tunings
from humming_gen.reference import reference_gemm
from humming_gen.tuning import candidate_tunings, store

pytestmark = pytest.mark.gpu


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def test_autotune_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path))
    layer = hg.LayerConfig(n=1024, k=1024, scheme="w4a16-int4-g128")
    target = hg.Target.current()
    plan = heuristic_tunings(layer, target)
    cands = {m_max: candidate_tunings(layer, target, m_max)[1:3] for m_max in (plan.buckets[0][0],)}
    results = hg.autotune(layer, ms=[1, 64], candidates=cands, rounds=2, replays=3, min_layers=2)
    assert [r["ms"] for r in results] == [[1], [64]]
    for r in results:
        assert all(us > 0 for us in r["us"].values()) and r["gain"] >= 1.0
        assert len(r["times"]) == (3 if r["m_max"] == plan.buckets[0][0] else 1)
    chosen = choose_tunings(layer, target)
    assert [chosen.for_m(m) for m in (1, 64)] == [r["winner"] for r in results]
    # a stored non-heuristic tuning reaches QuantLinear, which computes correctly with it
    other = candidate_tunings(layer, target, plan.buckets[0][0])[1]
    store.save_entry(*store.device_identity(), layer, target.name, {plan.buckets[0][0]: {"tuning": other}})
    qw = layer.scheme.quantize(torch.randn(1024, 1024, device="cuda") * 0.02)
    q = hg.QuantLinear.from_quantized(qw)
    assert q.tunings.for_m(1) == other
    x = torch.randn(1, 1024, device="cuda").bfloat16()
    assert _rel(q(x), reference_gemm(x.double(), qw)) < 1e-2
    explicit = hg.QuantLinear.from_quantized(qw, tunings=plan)  # explicit tunings win over the store
    assert explicit.tunings == plan


CASES = [(fmt, dtype, pipeline) for fmt in ("w4a16-int4-g128", "w8a16-int8-channel")
         for dtype in (torch.bfloat16, torch.float16) for pipeline in (None, "warp_specialized")]


@pytest.mark.parametrize("fmt,dtype,pipeline", CASES,
                         ids=[f"{f}-{str(d)[6:]}-{p or 'standard'}" for f, d, p in CASES])
def test_batch_invariant_rows_are_bitwise_equal(fmt, dtype, pipeline):
    n, k = 2048, 4096
    target = hg.Target.current()
    torch.manual_seed(0)
    qw = hg.scheme(fmt).quantize(torch.randn(n, k, device="cuda") * 0.02)
    layer_config = hg.LayerConfig(n=n, k=k, scheme=qw.scheme, dtype=str(dtype)[6:], out_dtype=str(dtype)[6:])
    try:
        tunings = choose_tunings(layer_config, target, batch_invariant=True, pipeline=pipeline)
    except ValueError as e:
        pytest.skip(f"{pipeline} on {target.name}: {str(e).splitlines()[-1]}")
    layer = hg.QuantLinear.from_quantized(qw, dtype=dtype, batch_invariant=True, tunings=tunings)
    x = torch.randn(4096, k, device="cuda").to(dtype)
    full = layer(x)
    assert _rel(full, reference_gemm(x.double(), qw)) < 1e-2
    for m in (1, 33, 700):
        assert torch.equal(layer(x[:m]), full[:m]), f"M={m}"
    for r in (1, 100, 4095):
        assert torch.equal(layer(x[r:r + 1])[0], full[r]), f"row {r} alone"
    other = x.clone()
    other[::2] = torch.randn_like(other[::2]) * 100  # the other rows change, odd rows stay
    assert torch.equal(layer(other)[1::2], full[1::2])
