"""Benchmark results: the device limits, the JSON schema, the markdown table, the PNG plot and a progress line.

Nothing here needs a GPU, so the CLI's parsing, the table and the plot are tested on synthetic results.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

SCHEMA = "humming_gen.bench/1"
ROW_FIELDS = ("impl", "format", "shape", "n", "k", "m", "layers", "graph_us")  # every row has these
IMPL_CUBLAS = "cublas-bf16"
IMPL_CUBLAS_FP8 = "cublaslt-fp8"  # torch._scaled_mm on pre-quantized e4m3 inputs, rowwise scales (issue 10's column)
BASELINES = (IMPL_CUBLAS, IMPL_CUBLAS_FP8)  # per shape, not per format
IMPL_OURS = "humming_gen"
IMPL_HUMMING = "humming"

# Memory limit: the device-to-device copy rate (bytes read plus written), measured where we have measured it
# (docs/BENCHMARKS.md: H200 4245 GB/s); compute limit: dense bf16 tensor-core peak of the data sheet.
DEVICE_LIMITS = {
    "H200": {"memory_gbps": 4245.0, "compute_tflops": 989.0,
             "source": "H200: measured copy 4245 GB/s (docs/BENCHMARKS.md), data-sheet dense bf16 989 TFLOP/s"},
    "H100": {"memory_gbps": 3350.0, "compute_tflops": 989.0,
             "source": "H100 SXM data sheet: 3.35 TB/s, dense bf16 989 TFLOP/s"},
}


def device_limits(device_name: str) -> dict[str, Any] | None:
    """The table's limits for a device name such as 'NVIDIA H200' (None: measure them)."""
    for key, limits in DEVICE_LIMITS.items():
        if key in device_name.split() or device_name.endswith(key):
            return dict(limits)
    return None


def add_rates(row: dict[str, Any]) -> dict[str, Any]:
    """Achieved GB/s (bytes moved: weight, activations, output) and TFLOP/s of a timed row."""
    if row.get("graph_us") and row.get("bytes"):
        row["gbps"] = row["bytes"] / (row["graph_us"] * 1e3)
    if row.get("graph_us"):
        row["tflops"] = 2 * row["m"] * row["n"] * row["k"] / (row["graph_us"] * 1e6)
    return row


def check_results(results: dict[str, Any]) -> None:
    """ValueError naming the first field that breaks the schema (`SCHEMA`) of `results`."""
    for key, kind in (("schema", str), ("gpu", str), ("limits", dict), ("rows", list), ("ms", list)):
        if not isinstance(results.get(key), kind):
            raise ValueError(f"benchmark results: {key!r} must be a {kind.__name__}, got {results.get(key)!r:.60}")
    if results["schema"] != SCHEMA:
        raise ValueError(f"benchmark results: schema {results['schema']!r}; expected {SCHEMA!r}")
    for i, row in enumerate(results["rows"]):
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing:
            raise ValueError(f"benchmark results: rows[{i}] lacks {missing}")


def write_json(results: dict[str, Any], path: str | Path) -> Path:
    check_results(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    return path


def _impl_label(row: dict[str, Any]) -> str:
    if row["impl"] in BASELINES:
        return row["impl"]
    return f"{row['impl']} {row['format']}"


def format_table(results: dict[str, Any]) -> str:
    """One markdown table per shape: M rows, a column per implementation (cuBLAS bf16, cuBLASLt fp8 where a format
    quantizes activations to fp8, then each format's ours and Humming's), CUDA-graph us per layer; 'err' where an
    implementation failed, '-' where it did not run."""
    rows = results["rows"]
    lines = [f"CUDA-graph us per layer on {results['gpu']} (median of {results.get('replays', 20)} replays)"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        in_shape = [r for r in rows if r["shape"] == shape]
        columns = list(dict.fromkeys(_impl_label(r) for r in in_shape))
        lines += ["", f"N x K = {shape}", "| M | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for m in results["ms"]:
            cells = []
            for column in columns:
                r = next((r for r in in_shape if _impl_label(r) == column and r["m"] == m), None)
                cells.append("-" if r is None else "err" if r.get("error") or r.get("graph_us") is None
                             else f"{r['graph_us']:.1f}")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    errs = {}
    for r in rows:
        if r.get("rel_err") is not None:
            errs[_impl_label(r)] = max(errs.get(_impl_label(r), 0.0), r["rel_err"])
    if errs:
        lines += ["", "max relative error vs the float64 reference: "
                  + ", ".join(f"{k} {v:.1e}" for k, v in errs.items())]
    limits = results["limits"]
    lines.append(f"limits: memory {limits['memory_gbps']:.0f} GB/s, compute {limits['compute_tflops']:.0f} TFLOP/s "
                 f"({limits['source']})")
    return "\n".join(lines)


def plot_results(results: dict[str, Any], path_prefix: str | Path) -> list[Path]:
    """One PNG per (shape, format): time, achieved GB/s and achieved TFLOP/s against M, a line per implementation,
    the memory and compute limits drawn. Needs matplotlib (ImportError otherwise); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limits = results["limits"]
    rows = [r for r in results["rows"] if r.get("graph_us") and not r.get("error")]
    written = []
    groups = dict.fromkeys((r["shape"], r["format"]) for r in rows if r["impl"] not in BASELINES)
    for shape, fmt in groups:
        group = [r for r in rows if r["shape"] == shape and (r["format"] == fmt or r["impl"] in BASELINES)]
        ours = sorted((r for r in group if r["impl"] == IMPL_OURS), key=lambda r: r["m"])
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
        for label in dict.fromkeys(_impl_label(r) for r in group):
            series = sorted((r for r in group if _impl_label(r) == label), key=lambda r: r["m"])
            ms = [r["m"] for r in series]
            axes[0].plot(ms, [r["graph_us"] for r in series], marker="o", label=label)
            axes[1].plot(ms, [r.get("gbps", 0) for r in series], marker="o", label=label)
            axes[2].plot(ms, [r["tflops"] for r in series], marker="o", label=label)
        if ours:
            ms = [r["m"] for r in ours]
            bound = [max(r["bytes"] / (limits["memory_gbps"] * 1e3),
                         2 * r["m"] * r["n"] * r["k"] / (limits["compute_tflops"] * 1e6)) for r in ours]
            axes[0].plot(ms, bound, "k--", label=f"limit ({fmt} bytes, peak compute)")
        axes[1].axhline(limits["memory_gbps"], color="k", linestyle="--", label="memory limit")
        axes[2].axhline(limits["compute_tflops"], color="k", linestyle="--", label="compute limit")
        for ax, ylabel in zip(axes, ("us per layer (CUDA graph)", "achieved GB/s", "achieved TFLOP/s")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M (tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{fmt}, N x K = {shape}, {results['gpu']}")
        fig.tight_layout()
        path = Path(f"{path_prefix}-{fmt}-{shape}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


class Progress:
    """'[i/total] what' while a benchmark runs: one line redrawn with \\r on a terminal, a line per step elsewhere
    (logs and pipes get no carriage returns)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())
        self.start = time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        text = f"[{self.done}/{self.total}] {what} ({time.perf_counter() - self.start:.0f}s)"
        if self.terminal:
            self.stream.write(f"\r\033[K{text}")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()
