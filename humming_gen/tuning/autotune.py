"""autotune: time candidate tunings of a layer on the current GPU and store the winner of each M bucket.

The method is the benchmark's (docs/BENCHMARKS.md, humming_gen/bench/timing.py): distinct weights several times the
L2 so that each kernel reads its weight cold, their launches in one CUDA graph, the median of the replays. The
candidates of a bucket are timed in turn, `rounds` times over with the order rotated, so that clock drift shows as
round-to-round spread, not as a difference between candidates; a candidate's time is its best round. A winner
replaces the heuristics' tuning only where it is faster by more than `margin` (noise must not flip a bucket).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.targets import Target

DEFAULT_ROUNDS = 3
DEFAULT_REPLAYS = 10
DEFAULT_MARGIN = 0.02


def _candidates_per_bucket(layer: LayerConfig, target: Target, heuristic, buckets: Sequence[int | None],
                           candidates) -> dict[int | None, list[TuningConfig]]:
    """The heuristics' tuning first, then the given candidates (a sequence for every bucket, or a mapping
    m_max -> sequence) or, with None, candidate_tunings'; each checked to compose with the layer's weight layout."""
    from humming_gen.codegen import compose
    from humming_gen.tuning.candidates import candidate_tunings

    layout = compose(layer, ComputeConfig(), heuristic.buckets[0][1], target).layout
    own = dict(heuristic.buckets)
    out = {}
    for m_max in buckets:
        if candidates is None:
            out[m_max] = candidate_tunings(layer, target, m_max, heuristic=heuristic)
            continue
        given = candidates.get(m_max, ()) if isinstance(candidates, Mapping) else candidates
        tunings = [own[m_max]]
        for i, t in enumerate(given):
            if not isinstance(t, TuningConfig):
                raise TypeError(f"candidates[{i}] must be a TuningConfig, got {type(t).__name__}")
            try:
                plan_layout = compose(layer, ComputeConfig(), t, target).layout
            except ValueError as e:
                raise ValueError(f"candidates[{i}] ({t.summary()}) cannot serve {layer.summary()} on "
                                 f"{target.name}: {e}") from None
            if plan_layout != layout:
                raise ValueError(f"candidates[{i}] ({t.summary()}) reads another weight layout than the layer's "
                                 f"heuristic kernels; a QuantLinear keeps one packed weight, so every tuning must "
                                 f"keep block_n, warps_n and the warp's k slice")
            tunings.append(t)
        out[m_max] = list(dict.fromkeys(tunings))
    return out


def autotune(layer_config: LayerConfig, ms: Sequence[int], target: "Target | str | None" = None,
             candidates: "Sequence[TuningConfig] | Mapping[int | None, Sequence[TuningConfig]] | None" = None, *,
             rounds: int = DEFAULT_ROUNDS, replays: int = DEFAULT_REPLAYS, min_layers: int = 4,
             margin: float = DEFAULT_MARGIN, store: bool = True, compiler: str | None = None,
             log: Callable[[str], None] | None = print) -> list[dict[str, Any]]:
    """Time candidate tunings for the M buckets holding `ms` on the current GPU; store the winners.

    candidates: None (humming_gen.tuning.candidate_tunings around the heuristics, both pipelines), a sequence of
    TuningConfigs tried in every bucket, or a mapping m_max -> sequence; the heuristics' tuning is always timed.
    Returns one dict per bucket: m_max, ms, winner and heuristic (TuningConfigs), us and heuristic_us (per M),
    gain (heuristic time / winner time, summed over the bucket's ms), times (tuning summary -> us per M).
    Raises RuntimeError without a GPU, ValueError for bad arguments (naming them).
    """
    from humming_gen.bench.report import Progress
    from humming_gen.bench.timing import cold_layer_count, graph_time_us
    from humming_gen.codegen import compose
    from humming_gen.config.validate import check_int
    from humming_gen.heuristics import heuristic_tunings
    from humming_gen.kernel import _resolve_target, build_many
    from humming_gen.layer.weights import prepare_weight
    from humming_gen.tuning.candidates import bucket_of
    from humming_gen.tuning.store import device_identity, save_entry

    if not isinstance(layer_config, LayerConfig):
        raise TypeError(f"layer_config must be a LayerConfig, got {type(layer_config).__name__}")
    ms = list(ms) if not isinstance(ms, int) else [ms]
    if not ms:
        raise ValueError("ms: give at least one M (token count) to tune for, e.g. ms=[1, 16, 64]")
    for m in ms:
        check_int("autotune", "ms", m, lo=1, hi=2**31 - 1, why="token counts to time")
    check_int("autotune", "rounds", rounds, lo=1, hi=100)
    check_int("autotune", "replays", replays, lo=1, hi=10_000)
    if not 0 <= margin < 1:
        raise ValueError(f"margin={margin!r}; allowed: 0 <= margin < 1 (the gain a winner needs over the heuristics)")
    identity = device_identity()
    if identity is None:
        raise RuntimeError("autotune times kernels on the current GPU; torch sees none "
                           "(torch.cuda.is_available() is False)")
    current = Target.current()
    target = _resolve_target(target) if target is not None else current
    if target.arch != current.arch:
        raise ValueError(f"target={target.name!r}, but the current GPU is {identity[0]} ({current.name}); autotune "
                         f"times kernels on the current GPU, so give target=None or {current.name!r}")
    layer = layer_config
    heuristic = heuristic_tunings(layer, target)
    buckets: dict[int | None, list[int]] = {}
    for m in sorted(set(ms)):
        buckets.setdefault(bucket_of(heuristic, m), []).append(m)
    per_bucket = _candidates_per_bucket(layer, target, heuristic, list(buckets), candidates)
    say = log or (lambda _: None)

    # compile every candidate (in parallel), pack the weights once: all candidates read one layout
    unique = list(dict.fromkeys(t for ts in per_bucket.values() for t in ts))
    plans = [compose(layer, ComputeConfig(), t, target) for t in unique]
    say(f"autotune {layer.summary()}: {len(unique)} kernels for buckets {[b for b in buckets]} on {identity[0]}")
    kernels = dict(zip(unique, build_many(plans, compiler=compiler)))
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, layer.dtype)
    out_dtype = getattr(torch, layer.out_dtype)
    bits = layer.scheme.weight.bits
    count = cold_layer_count(max(1, layer.n * layer.k * bits // 8), target.l2_bytes, min_layers)
    torch.manual_seed(0)
    weights = [prepare_weight(plans[0], layer.scheme.quantize(torch.randn(layer.n, layer.k, device=device) * 0.02),
                              device) for _ in range(count)]
    bias = torch.randn(layer.n, device=device, dtype=dtype) if layer.has_bias else None
    k_pad = math.ceil(layer.k / 8) * 8  # the kernels read rows of 16-byte multiples (QuantLinear pads the same way)

    def inputs(m: int, layouts) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """Per activation layout the kernels read ("rows", "panels": Kernel.activation_layout), their inputs."""
        x = torch.nn.functional.pad(torch.randn(m, layer.k, device=device, dtype=dtype), (0, k_pad - layer.k))
        if layer.scheme.activation is None:
            return {layout: (x, None) for layout in layouts}
        from humming_gen.activation import quantize_activation

        out = {}
        for layout in layouts:
            qa = quantize_activation(x[:, :layer.k], layer.scheme.activation, layout=layout)
            out[layout] = qa.codes, qa.scales
        return out

    progress = Progress(rounds * sum(len(per_bucket[b]) * len(bms) for b, bms in buckets.items()))
    results = []
    try:
        for m_max, bucket_ms in buckets.items():
            tunings = per_bucket[m_max]
            times: dict[TuningConfig, dict[int, float]] = {t: {} for t in tunings}
            for m in bucket_ms:
                # the codes in each layout the candidates read (the panels kernels refuse rows, and vice versa)
                quantized = inputs(m, dict.fromkeys(kernels[t].activation_layout for t in tunings))
                out = torch.empty(m, layer.n, device=device, dtype=out_dtype)
                for r in range(rounds):
                    for t in tunings[r % len(tunings):] + tunings[:r % len(tunings)]:  # rotated each round
                        a, a_scale = quantized[kernels[t].activation_layout]
                        # bound per timing and dropped after: every candidate's split-K scratch for every weight
                        # at once would not fit at large M
                        launchers = [kernels[t].bind(w, bias, device, m) for w in weights]
                        fns = [lambda x, f=f: f(x, out, a_scale) for f in launchers]
                        us = graph_time_us(fns, a, replays)
                        times[t][m] = min(us, times[t].get(m, math.inf))
                        del launchers, fns
                        progress.step(f"bucket M <= {m_max} M={m} {t.pipeline} block_m={t.block_m} "
                                      f"split_k={t.split_k}: {us:.1f} us")
            own = tunings[0]

            def score(t: TuningConfig) -> float:
                return sum(times[t][m] / times[own][m] for m in bucket_ms)

            best = min(tunings, key=score)
            winner = best if score(best) < len(bucket_ms) * (1 - margin) else own
            gain = sum(times[own][m] for m in bucket_ms) / sum(times[winner][m] for m in bucket_ms)
            results.append({"m_max": m_max, "ms": bucket_ms, "winner": winner, "heuristic": own,
                            "us": dict(times[winner]), "heuristic_us": dict(times[own]), "gain": gain,
                            "times": {t.summary(): dict(v) for t, v in times.items()}})
    finally:
        progress.close()
        torch.cuda.empty_cache()
    for r in results:
        say(f"bucket M <= {r['m_max']}: x{r['gain']:.3f} over the heuristics; {r['winner'].summary()}")
    if store:
        path = save_entry(*identity, layer, target.name, {
            r["m_max"]: {"tuning": r["winner"], "us": {str(m): v for m, v in r["us"].items()},
                         "heuristic_us": {str(m): v for m, v in r["heuristic_us"].items()},
                         "candidates": len(r["times"])} for r in results})
        say(f"stored in {path}")
    return results
