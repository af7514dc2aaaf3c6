"""run_benchmark: the canonical benchmark of docs/BENCHMARKS.md over formats x shapes x M, humming_gen beside cuBLAS
bf16 and (when its package imports) Humming, every number from one CUDA graph of distinct cold layers, numerics
against the float64 reference on the same run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from humming_gen.bench import scheme_for
from humming_gen.bench.report import (IMPL_CUBLAS, IMPL_CUBLAS_FP8, IMPL_HUMMING, IMPL_OURS, SCHEMA, Progress,
                                      add_rates, device_limits)
from humming_gen.bench.timing import cold_layer_count, copy_gbps, graph_time_us, matmul_tflops


def build_layers(name: str, n: int, k: int, count: int, **layer_kwargs) -> tuple[list, list]:
    """`count` QuantLinear layers of random weights (randn * 0.02) in format `name` -> (quantized weights, layers);
    `layer_kwargs` go to QuantLinear (tunings=, batch_invariant=, ...)."""
    from humming_gen.layer.linear import QuantLinear

    scheme = scheme_for(name)
    qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(count)]
    return qws, [QuantLinear.from_quantized(q, **layer_kwargs) for q in qws]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def limits_for_device() -> dict[str, Any]:
    """Memory and compute limits from report.DEVICE_LIMITS, or measured (copy rate, cuBLAS bf16 8192^3)."""
    limits = device_limits(torch.cuda.get_device_name())
    if limits is None:
        limits = {"memory_gbps": copy_gbps(), "compute_tflops": matmul_tflops(),
                  "source": "measured here: device-to-device copy, cuBLAS bf16 8192^3"}
    return limits


def _time_rows(rows: list, progress: Progress, fns: Sequence[Callable], xs: dict[int, torch.Tensor], replays: int,
               base: dict[str, Any], bytes_of: Callable[[int], int], check: Callable | None = None,
               tuning_of: Callable | None = None) -> None:
    for m, x in xs.items():
        row = {**base, "m": m, "bytes": bytes_of(m), "rel_err": None}
        try:
            if check is not None:
                row["rel_err"] = check(x)
            row["graph_us"] = graph_time_us(fns, x, replays)
            if tuning_of is not None:
                row["tuning"] = tuning_of(m)
        except Exception as e:  # one failing implementation (Humming's heuristics on some shapes) is a table cell
            row.update(graph_us=None, error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        rows.append(add_rates(row))
        progress.step(f"{base['impl']} {base['format'] or ''} {base['shape']} M={m}: "
                      + (f"{row['graph_us']:.1f} us" if row["graph_us"] else "failed"))


def fp8_baseline_wanted(formats: Sequence[str]) -> bool:
    """cuBLASLt fp8 joins the table where a format quantizes its activations to fp8 (e4m3 / e5m2): the vendor
    GEMM on inputs already quantized, which our times (quantization included) are read against."""
    for name in formats:
        act = scheme_for(name).activation
        if act is not None and act.dtype.name.startswith("float8"):
            return True
    return False


def cublaslt_fp8_layers(n: int, k: int, count: int, ms: Sequence[int]) -> tuple[list[Callable], dict[int, torch.Tensor]]:
    """`count` fp8 GEMMs (torch._scaled_mm, e4m3 weights and activations, fp32 rowwise scales, bf16 out) and their
    e4m3 inputs per M: the fns take an input and look its scales up by row count (no allocation in the graph)."""
    weights = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.float8_e4m3fn) for _ in range(count)]
    scale_b = torch.ones(1, n, device="cuda")
    scale_a = {m: torch.ones(m, 1, device="cuda") for m in ms}
    xs = {m: torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn) for m in ms}
    fns = [lambda x, w=w: torch._scaled_mm(x, w.t(), scale_a=scale_a[x.shape[0]], scale_b=scale_b,
                                           out_dtype=torch.bfloat16) for w in weights]
    return fns, xs


def run_benchmark(formats: Sequence[str], shapes: Sequence[tuple[int, int]], ms: Sequence[int], *,
                  min_layers: int = 8, replays: int = 20, humming: bool = True, standard: Sequence[str] = (),
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time every (shape, format, M); returns results of schema report.SCHEMA.

    standard: formats also timed with every bucket on the standard pipeline (impl "humming_gen-standard").
    humming: also time Humming's HummingLayer where its package imports and maps the format."""
    from humming_gen import __version__
    from humming_gen.bench.humming import FORMATS as HUMMING_FORMATS
    from humming_gen.bench.humming import HummingUnavailable, humming_layers
    from humming_gen.heuristics import choose_tunings
    from humming_gen.reference import reference_gemm
    from humming_gen.targets import Target
    from humming_gen.tuning.store import device_identity

    if not torch.cuda.is_available():
        raise RuntimeError("the benchmark needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.manual_seed(0)
    target = Target.current()
    gpu, driver = device_identity() or (torch.cuda.get_device_name(), "?")
    results: dict[str, Any] = {"schema": SCHEMA, "gpu": gpu, "driver": driver, "humming_gen": __version__,
                               "target": target.name, "limits": limits_for_device(), "ms": list(ms),
                               "replays": replays, "min_layers": min_layers, "rows": []}
    rows = results["rows"]
    baselines = 1 + int(fp8_baseline_wanted(formats) and torch.cuda.get_device_capability() >= (8, 9))
    total = len(shapes) * len(ms) * (baselines + len(formats) * (1 + int(humming))
                                     + len([f for f in formats if f in standard]))
    progress = Progress(total)
    try:
        for n, k in shapes:
            shape = f"{n}x{k}"
            xs = {m: torch.randn(m, k, device="cuda").bfloat16() for m in ms}
            act_out = (lambda m: 2 * m * (k + n))  # bf16 activations read, bf16 output written
            count = cold_layer_count(n * k * 2, target.l2_bytes, min_layers)
            dense = [torch.randn(n, k, device="cuda").bfloat16() * 0.02 for _ in range(count)]
            _time_rows(rows, progress, [lambda x, w=w: x @ w.t() for w in dense], xs, replays,
                       dict(impl=IMPL_CUBLAS, format=None, shape=shape, n=n, k=k, layers=count),
                       lambda m: n * k * 2 + act_out(m))
            del dense
            if fp8_baseline_wanted(formats) and torch.cuda.get_device_capability() >= (8, 9):
                count = cold_layer_count(n * k, target.l2_bytes, min_layers)
                fns, xs8 = cublaslt_fp8_layers(n, k, count, ms)
                _time_rows(rows, progress, fns, xs8, replays,
                           dict(impl=IMPL_CUBLAS_FP8, format=None, shape=shape, n=n, k=k, layers=count),
                           lambda m: n * k + m * k + 2 * m * n)
                del fns, xs8
            for name in formats:
                bits = scheme_for(name).weight.bits
                count = cold_layer_count(max(1, n * k * bits // 8), target.l2_bytes, min_layers)
                variants = [(IMPL_OURS, {})]
                if name in standard:
                    variants.append((f"{IMPL_OURS}-standard", dict(tunings=choose_tunings(
                        _layer_config(name, n, k), target, pipeline="standard"))))
                for impl, kwargs in variants:
                    qws, layers = build_layers(name, n, k, count, **kwargs)
                    wbytes = layers[0].weight.nbytes()
                    _time_rows(rows, progress, layers, xs, replays,
                               dict(impl=impl, format=name, shape=shape, n=n, k=k, layers=count, weight_bytes=wbytes),
                               lambda m, wbytes=wbytes: wbytes + act_out(m),
                               check=lambda x, q=qws[0], lay=layers[0]: rel_err(lay(x), reference_gemm(x.double(), q)),
                               tuning_of=lambda m, lay=layers[0]: lay.kernel_for(m).plan.tuning.summary())
                    del qws, layers
                    torch.cuda.empty_cache()
                if not humming:
                    continue
                try:
                    if name not in HUMMING_FORMATS:
                        raise HummingUnavailable(f"no Humming mapping for {name}")
                    h_layers, w_ref = humming_layers(name, n, k, count)
                except Exception as e:  # optional comparison: say why and go on
                    reason = str(e) if isinstance(e, HummingUnavailable) else f"{type(e).__name__}: {e}"
                    log(f"humming {name} {shape}: skipped ({' '.join(reason.split())[:300]})")
                    for _ in ms:
                        progress.step(f"humming {name} {shape}: skipped")
                    continue
                w_ref = w_ref.double()
                _time_rows(rows, progress, h_layers, xs, replays,
                           dict(impl=IMPL_HUMMING, format=name, shape=shape, n=n, k=k, layers=count),
                           lambda m: n * k * bits // 8 + act_out(m),
                           check=lambda x, lay=h_layers[0], w=w_ref: rel_err(lay(x), x.double() @ w.t()))
                del h_layers, w_ref
                torch.cuda.empty_cache()
    finally:
        progress.close()
    return results


def _layer_config(name: str, n: int, k: int):
    from humming_gen.config import LayerConfig

    return LayerConfig(n=n, k=k, scheme=scheme_for(name))
