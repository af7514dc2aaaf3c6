"""Autotuning without a GPU: candidates (all compose, share the layer's weight layout, both pipelines near the
crossover), the tuning store (round trip, keying, corrupt files, concurrent writers) and choose_tunings picking
stored results up; batch-invariant tunings (one K summation order in every bucket, split_k = 1)."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import warnings

import attrs
import pytest
import torch

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.components.numeric.exponent_fold import fold_reasons
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings, heuristic_tunings
from humming_gen.heuristics.batch_invariant import invariance_reasons, reduction_order
from humming_gen.pipelines.base import ComposeError
from humming_gen.targets import get_target
from humming_gen.tuning import candidates as cand
from humming_gen.tuning import store

DEVICE = ("NVIDIA H200", "13000")
LAYERS = [(4096, 4096, "w4a16-int4-g128"), (576, 7168, "w4a16-int4-g128"), (14336, 4096, "w3a16-int3-g128"),
          (4096, 4096, "w8a16-int8-channel"), (2880, 2880, "w4a16-int4-g128-zp"), (1024, 2000, "w4a16-mxfp4")]
TARGETS = ["sm_90a", "sm_80", "sm_120a"]


def _layer(n: int, k: int, scheme: str) -> LayerConfig:
    return LayerConfig(n=n, k=k, scheme=scheme)


@pytest.fixture
def on_gpu(monkeypatch, tmp_path):
    """A store in tmp_path and a pretend H200, so that choose_tunings looks stored tunings up."""
    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(store, "device_identity", lambda device=None: DEVICE)
    return tmp_path / store.STORE_NAME


# --- candidates --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("n,k,scheme", LAYERS, ids=[f"{s}-n{n}k{k}" for n, k, s in LAYERS])
def test_candidates_compose_and_share_the_layout(n, k, scheme, target_name):
    layer, target = _layer(n, k, scheme), get_target(target_name)
    plan = heuristic_tunings(layer, target)
    layout = compose(layer, ComputeConfig(), plan.buckets[0][1], target).layout
    for m_max, own in plan.buckets:
        tunings = cand.candidate_tunings(layer, target, m_max, heuristic=plan)
        assert tunings[0] == own and len(tunings) == len(set(tunings)) and len(tunings) <= cand.MAX_CANDIDATES
        assert len(tunings) >= 4, f"bucket {m_max}: only {len(tunings)} candidates"
        for t in tunings:
            assert compose(layer, ComputeConfig(), t, target).layout == layout


SWEEP_SHAPES = [(256, 1024), (4000, 3072), (576, 7168), (8192, 8192)]


@pytest.mark.parametrize("target_name", ["sm_80", "sm_89", "sm_90a"])
@pytest.mark.parametrize("scheme", hg.list_presets())
def test_candidates_of_every_preset_shape_and_bucket(scheme, target_name):
    """Every layer with a kernel on the target gets valid candidates in every bucket (folded too, where the scheme
    allows it): a variant that is no valid tuning for it (e.g. warps_k=4 of a 4x2-warp tile, 32 warps, for
    w4a8-mxfp4-fp8 at n=256 k=1024) is skipped, not raised. A layer without a kernel there is refused as such."""
    target = get_target(target_name)
    folds = [False] + ([True] if not fold_reasons(hg.scheme(scheme)) else [])
    for (n, k), fold in itertools.product(SWEEP_SHAPES, folds):
        layer = LayerConfig(n=n, k=k, scheme=scheme, fold_scales=fold)
        plan = heuristic_tunings(layer, target)
        try:
            layout = compose(layer, ComputeConfig(), plan.buckets[0][1], target).layout
        except ComposeError:
            with pytest.raises(ComposeError):
                cand.candidate_tunings(layer, target, plan.buckets[0][0], heuristic=plan)
            continue
        for m_max, own in plan.buckets:
            tunings = cand.candidate_tunings(layer, target, m_max, heuristic=plan)
            where = f"{layer.summary()} {target_name} bucket {m_max}"
            assert tunings[0] == own and len(set(tunings)) == len(tunings) <= cand.MAX_CANDIDATES, where
            assert all(compose(layer, ComputeConfig(), t, target).layout == layout for t in tunings), where


def test_candidates_offer_both_pipelines_near_the_crossover():
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    for m_max in (16, 32, 64):
        pipelines = {t.pipeline for t in cand.candidate_tunings(layer, target, m_max)}
        assert pipelines == {"standard", "warp_specialized"}, m_max
    assert {t.pipeline for t in cand.candidate_tunings(layer, target, 8)} == {"standard"}


def test_candidates_refuse_a_bucket_the_plan_lacks():
    with pytest.raises(ValueError, match=r"m_max=7 is not a bucket of the plan; allowed: \[8, 16"):
        cand.candidate_tunings(_layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a"), 7)


# --- the store ---------------------------------------------------------------------------------------------------
def _other_tuning(layer, target, m_max):
    """A candidate of the bucket that is not the heuristics' own."""
    return cand.candidate_tunings(layer, target, m_max)[1]


def test_store_round_trip_and_keying(on_gpu):
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    tuned = {16: _other_tuning(layer, target, 16), None: _other_tuning(layer, target, None)}
    store.save_entry(*DEVICE, layer, "sm_90a", {m: {"tuning": t, "us": {"16": 1.0}} for m, t in tuned.items()})
    assert store.stored_tunings(layer, "sm_90a", *DEVICE) == tuned
    data = json.loads(on_gpu.read_text())
    (entry,) = data["entries"].values()
    assert set(entry["buckets"]) == {"16", "inf"} and entry["device"] == DEVICE[0] and entry["version"]
    # another device, driver, layer or target finds nothing
    assert store.stored_tunings(layer, "sm_90a", "NVIDIA H100", DEVICE[1]) == {}
    assert store.stored_tunings(layer, "sm_90a", DEVICE[0], "12080") == {}
    assert store.stored_tunings(attrs.evolve(layer, has_bias=True), "sm_90a", *DEVICE) == {}
    assert store.stored_tunings(layer, "sm_89", *DEVICE) == {}
    # a later run of one bucket keeps the other bucket's result
    again = _other_tuning(layer, target, 8)
    store.save_entry(*DEVICE, layer, "sm_90a", {8: {"tuning": again}})
    assert store.stored_tunings(layer, "sm_90a", *DEVICE) == {**tuned, 8: again}


def test_store_of_another_version_is_ignored(on_gpu):
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    store.save_entry(*DEVICE, layer, "sm_90a", {16: {"tuning": _other_tuning(layer, target, 16)}})
    data = json.loads(on_gpu.read_text())
    for entry in data["entries"].values():
        entry["version"] = "0.0.0-old"
    on_gpu.write_text(json.dumps(data))
    assert store.stored_tunings(layer, "sm_90a", *DEVICE) == {}


def test_choose_tunings_picks_stored_results_up(on_gpu):
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    plan = heuristic_tunings(layer, target)
    tuned = _other_tuning(layer, target, 16)
    assert choose_tunings(layer, target) == plan  # nothing stored yet
    store.save_entry(*DEVICE, layer, "sm_90a", {16: {"tuning": tuned}})
    chosen = choose_tunings(layer, target)
    assert chosen.for_m(16) == tuned and chosen.for_m(9) == tuned
    assert [(m, t) for m, t in chosen.buckets if m != 16] == [(m, t) for m, t in plan.buckets if m != 16]
    # stored=False, a forced pipeline, overrides, another target or no GPU: the heuristics
    assert choose_tunings(layer, target, stored=False) == plan
    assert choose_tunings(layer, target, pipeline="standard") == heuristic_tunings(layer, target, pipeline="standard")
    assert choose_tunings(layer, get_target("sm_89")) == heuristic_tunings(
        layer, get_target("sm_89"))
    store.device_identity = lambda device=None: None  # restored by monkeypatch
    assert choose_tunings(layer, target) == plan


def test_folded_and_unfolded_layers_keep_their_own_stored_winners(on_gpu):
    """fold_scales is part of the store key: a QuantLinear whose MXFP4 group scales fold (sm_90a) takes the winners
    timed folded, and one that drops the fold (sm_89: no warp-specialized kernel reads folded scales) those of the
    unfolded layer, not the folded ones it looked up before it dropped it."""
    torch.manual_seed(0)
    w = torch.randn(256, 1024) * 0.02
    plain = _layer(256, 1024, "w4a8-mxfp4-fp8")
    folded = attrs.evolve(plain, fold_scales=True)
    assert store.entry_key(*DEVICE, plain) != store.entry_key(*DEVICE, folded)
    for target_name, folds in (("sm_90a", True), ("sm_89", False)):
        target = get_target(target_name)
        own = heuristic_tunings(plain, target).for_m(1 << 20)  # the open bucket's: two shallower rings
        winners = {plain: attrs.evolve(own, stages=own.stages - 1), folded: attrs.evolve(own, stages=own.stages - 2)}
        for layer, tuning in winners.items():
            store.save_entry(*DEVICE, layer, target_name, {None: {"tuning": tuning}})
        linear = hg.QuantLinear.from_float(w, "w4a8-mxfp4-fp8", target=target_name, device="cpu")
        assert linear.fold_scales == folds, target_name
        assert linear.tunings.for_m(1 << 20) == winners[folded if folds else plain], target_name


def test_stored_tuning_of_another_layout_is_skipped_with_a_warning(on_gpu):
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    own = heuristic_tunings(layer, target).for_m(16)
    other_layout = attrs.evolve(own, warps_n=4, block_n=256)  # another n split: another packing
    store.save_entry(*DEVICE, layer, "sm_90a", {16: {"tuning": other_layout}})
    with pytest.warns(UserWarning, match="reads another weight layout"):
        assert choose_tunings(layer, target).for_m(16) == own


@pytest.mark.parametrize("content", ["{not json", '{"format": 99, "entries": {}}', '["a list"]', "\x00\xff"])
def test_corrupt_store_warns_and_is_ignored(on_gpu, content):
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    on_gpu.write_bytes(content.encode("latin-1"))
    with pytest.warns(UserWarning, match="ignoring the tuning store"):
        assert choose_tunings(layer, target) == heuristic_tunings(layer, target)
    with pytest.warns(UserWarning, match="replacing the unreadable tuning store"):
        store.save_entry(*DEVICE, layer, "sm_90a", {16: {"tuning": _other_tuning(layer, target, 16)}})
    assert store.stored_tunings(layer, "sm_90a", *DEVICE)  # the replaced store reads again


def test_corrupt_bucket_entry_is_skipped(on_gpu):
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    tuned = _other_tuning(layer, target, 16)
    store.save_entry(*DEVICE, layer, "sm_90a", {16: {"tuning": tuned}, 32: {"tuning": tuned}})
    data = json.loads(on_gpu.read_text())
    (entry,) = data["entries"].values()
    entry["buckets"]["32"]["tuning"]["block_m"] = "many"
    on_gpu.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="ignoring stored tuning of bucket 32"):
        assert store.stored_tunings(layer, "sm_90a", *DEVICE) == {16: tuned}


def _writer(path: str, worker: int, count: int) -> None:
    target = get_target("sm_90a")
    for i in range(count):
        layer = _layer(256 * (1 + worker), 128 * (1 + i), "w4a16-int4-g128")
        store.save_entry(*DEVICE, layer, "sm_90a", {None: {"tuning": heuristic_tunings(layer, target).for_m(10**6),
                                                           "worker": worker, "i": i}}, path=store.Path(path))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "tunings.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 8)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = json.loads(path.read_text())
    assert len(data["entries"]) == 32
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tunings-")]  # no temporary files left


# --- batch invariance --------------------------------------------------------------------------------------------
BI_LAYERS = LAYERS + [(4096, 4096, "w4a16-int4-g100"), (4096, 4096, "w8a8-int8-channel")]


def _scheme(name):
    from humming_gen.bench import scheme_for

    return scheme_for(name)


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("n,k,scheme", BI_LAYERS, ids=[f"{s}-n{n}k{k}" for n, k, s in BI_LAYERS])
def test_batch_invariant_buckets_share_one_summation_order(n, k, scheme, target_name):
    layer, target = LayerConfig(n=n, k=k, scheme=_scheme(scheme)), get_target(target_name)
    plan = choose_tunings(layer, target, batch_invariant=True)
    assert invariance_reasons(layer, plan, target) == []
    assert {t.split_k for _, t in plan.buckets} == {1}
    assert len({t.pipeline for _, t in plan.buckets}) == 1
    assert len({reduction_order(layer, t, target) for _, t in plan.buckets}) == 1
    assert plan.buckets[-1][0] is None


def test_batch_invariant_warp_specialized_plan():
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    plan = choose_tunings(layer, target, batch_invariant=True, pipeline="warp_specialized")
    assert invariance_reasons(layer, plan, target) == []
    assert {t.pipeline for _, t in plan.buckets} == {"warp_specialized"}
    with pytest.raises(ValueError, match="warp-specialized pipeline cannot serve"):
        choose_tunings(layer, get_target("sm_80"), batch_invariant=True, pipeline="warp_specialized")


def test_the_heuristics_are_not_batch_invariant():
    """The rule can fail: the default plan splits K by M and mixes pipelines."""
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    reasons = invariance_reasons(layer, heuristic_tunings(layer, target), target)
    assert any("split_k=8" in r for r in reasons) and any("different orders" in r for r in reasons)
    standard = heuristic_tunings(layer, target, pipeline="standard")
    one_split = type(standard)(tuple((m, attrs.evolve(t, split_k=1)) for m, t in standard.buckets))
    assert [r for r in invariance_reasons(layer, one_split, target) if "different orders" in r]  # warps_k differs


def test_group_scale_placement_is_part_of_the_order():
    """A 16-row warp tile puts the group scale on the partial sums, a 32-row one on the weights: other sums."""
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    t = choose_tunings(layer, target, batch_invariant=True).for_m(1)
    narrow = attrs.evolve(t, block_m=16)
    assert reduction_order(layer, t, target) != reduction_order(layer, narrow, target)


def test_batch_invariant_refusals():
    qw = hg.QuantScheme("int4", group_size=128).quantize(torch.randn(256, 256))
    with pytest.raises(ValueError, match="batch_invariant=True, but row results would depend on the batch"):
        hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", batch_invariant=True,
                                      tunings=heuristic_tunings(_layer(256, 256, "w4a16-int4-g128"),
                                                                get_target("sm_90a")))
    q8 = hg.scheme("w8a8-fp8-tensor").quantize(torch.randn(256, 256))
    with pytest.raises(ValueError, match="per-tensor dynamic activation scales"):
        hg.QuantLinear.from_quantized(q8, target="sm_90a", device="cpu", batch_invariant=True)
    with pytest.raises(ValueError, match="takes no TuningConfig overrides"):
        choose_tunings(_layer(256, 256, "w4a16-int4-g128"), get_target("sm_90a"), batch_invariant=True, split_k=2)
    with pytest.raises(TypeError, match="ComputeConfig.batch_invariant"):
        hg.QuantLinear.from_quantized(qw, target="sm_90a", device="cpu", batch_invariant="yes")


def test_batch_invariant_kernels_compile_without_spills():
    """The pinned tiles (k split, wider warp tiles at small M) are new tunings: every one compiles clean."""
    from humming_gen.kernel import build_many

    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    plan = choose_tunings(layer, target, batch_invariant=True)
    kernels = build_many([compose(layer, ComputeConfig(batch_invariant=True), t, target) for t in plan.tunings()])
    for kernel in kernels:
        res = kernel.resources
        assert res.get("spill_store_bytes", 0) == 0 and res.get("spill_load_bytes", 0) == 0, (kernel.name, res)
        assert "batch_invariant=yes" in kernel.source


def test_no_warning_without_store(on_gpu):
    layer, target = _layer(4096, 4096, "w4a16-int4-g128"), get_target("sm_90a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_tunings(layer, target) == heuristic_tunings(layer, target)
