"""Timing by the method of docs/BENCHMARKS.md: distinct layers whose weights are several times the L2, their calls
captured in one CUDA graph, the median of `replays` replays divided by the number of calls; and eager wall time."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

COLD_L2_MULTIPLE = 3  # the layers of one timing hold this many L2s of weights, so each reads its weight cold
MAX_LAYERS = 64


def cold_layer_count(weight_bytes: int, l2_bytes: int, minimum: int = 8, maximum: int = MAX_LAYERS) -> int:
    """Distinct layers so that their weights are COLD_L2_MULTIPLE times the L2 (docs/BENCHMARKS.md, step 1)."""
    if weight_bytes <= 0:
        raise ValueError(f"weight_bytes must be positive, got {weight_bytes}")
    return min(maximum, max(minimum, math.ceil(COLD_L2_MULTIPLE * l2_bytes / weight_bytes)))


def graph_time_us(fns: Sequence[Callable], x: torch.Tensor, replays: int = 20) -> float:
    """Median time per call, in us, of the calls fns[i](x) captured in one CUDA graph and replayed `replays` times
    (each call warmed up first, so just-in-time work and lazily grown buffers stay out of the graph)."""
    for f in fns:
        f(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f(x)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for f in fns:
                f(x)
    torch.cuda.current_stream().wait_stream(s)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(fns))
    del g
    return statistics.median(times)


def alternating_graph_times(candidates: Sequence[Sequence[Callable]], x: torch.Tensor, rounds: int = 2
                             ) -> list[float]:
    """graph_time_us of each candidate (its list of calls), best of `rounds` rounds that take the candidates in
    turn, so neither a clock ramp nor the order of a sweep favours the first ones."""
    times: list[list[float]] = [[] for _ in candidates]
    for _ in range(rounds):
        for i, fns in enumerate(candidates):
            times[i].append(graph_time_us(fns, x))
    return [min(t) for t in times]


def eager_time_us(fns: Sequence[Callable], x: torch.Tensor, calls: int = 200, repeats: int = 5,
                  sync_each: bool = False) -> float:
    """Steady-state wall time per call, in us, of a synchronized loop of plain calls (graph time plus host
    overhead): the median of `repeats` loops, after a warm-up loop (first-call work such as a stream's launch
    configs stays out, as it does in a serving loop). sync_each: a sync after every call too, so no call's host
    work overlaps the previous call's kernels (host time plus GPU time)."""
    times = []
    for r in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(calls):
            fns[i % len(fns)](x)
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        if r:  # loop 0 warms up
            times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def print_host_profiles(call: Callable[[], object], calls: int, title: str, rows: int = 16) -> None:
    """Where `calls` eager calls spend their host time: the torch profiler's ops by self CPU time (launches,
    allocations, a sync that would serialise host and GPU) and cProfile's costliest Python functions."""
    import cProfile
    import pstats
    import sys

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    print(f"\n=== {title}: torch profiler, {calls} eager calls")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70))
    cp = cProfile.Profile()
    cp.enable()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    cp.disable()
    print(f"=== {title}: cProfile, {calls} eager calls")
    pstats.Stats(cp, stream=sys.stdout).sort_stats("tottime").print_stats(rows)


def copy_gbps(nbytes: int = 1 << 30, replays: int = 10) -> float:
    """Measured device-to-device copy rate, GB/s of bytes read plus written (the memory limit where the device
    has no entry in limits.DEVICE_LIMITS)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return nbytes / statistics.median(times) / 1e9


def matmul_tflops(size: int = 8192, replays: int = 10) -> float:
    """Measured bf16 GEMM rate of torch (cuBLAS), TFLOP/s: the compute limit for a device without an entry."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    return 2 * size**3 / (graph_time_us([lambda x: x @ b], a, replays) * 1e-6) / 1e12
