"""MoE benchmark (issue 11): humming_gen's MoE GEMMs and whole MoE layers beside Humming and a bf16 torch MoE.

Method of docs/BENCHMARKS.md: L = 4 distinct layers per shape and format (weights several times the L2, so each
call reads its experts cold), their calls captured in one CUDA graph, the median of 20 replays divided by L: us per
layer. Routing: M tokens, uniformly random top-k (torch.topk of softmax of randn), one routing per (model, M) that
every implementation shares.

1. Per GEMM (gate-up w13: N = 2I, K = H; down w2: N = H, K = I):
   - grouped: rows already grouped by expert, `humming_gen.grouped_moe_gemm(..., layout="grouped_contiguous")`
     (the way Humming's anchor numbers were measured);
   - indexed: the indexed GEMM as QuantMoE runs it (`humming_gen.moe_gemm` on `moe_align`'s routing; "indexed"
     with the routing computed outside the graph, "align + indexed" with moe_align inside, "align" alone);
   - Humming (`humming-kernels`, when importable): HummingLayer with num_experts, forward with
     gemm_type="grouped_contiguous" on the same grouped rows (and "indexed" with --humming grouped,indexed);
   - the Humming numbers measured earlier on this GPU (/work/shared/anchors/h200_moe*_graph.json, embedded below).
2. Whole layer (QuantMoE forward: routing, both GEMMs, activation, weighted top-k sum) beside a bf16 torch MoE
   (sort by expert, torch._grouped_mm for both GEMMs, index_add; CUDA graph) or, without torch._grouped_mm, an
   eager loop over the experts (not capturable: synchronised wall clock per call, said in the caption).
Numerics on the same run: sampled output rows of every GEMM and the whole layer at the smallest M against float64
products of the dequantized experts (relative Frobenius error).

    python bench/moe_bench.py --out out/moe          # all models, defaults (estimated 3-5 min on an H200, cold cache)
    python bench/moe_bench.py --models qwen3 --m 1,128 --formats w4a16-int4-g128 --humming none
    python bench/moe_bench.py --dry-run              # no GPU: the plan, token tiles and anchor tables
    python bench/moe_bench.py --pipeline standard    # QuantMoE's kernels all standard (default: on sm_90a the
                                                     # warp-specialized ones from 17 rows per expert on, W8A8's all)
    python bench/moe_bench.py --ws-option PREFETCH_CHUNK_ROWS=0  # a switch of the warp-specialized pipeline
                                                                # set for the run (the default's before / after)
    python bench/moe_bench.py --topk-reduce atomic   # GEMM2 adds into fp32 token rows (whole-layer table only)
    python bench/moe_bench.py --down-gemm indexed    # every bucket's down GEMM through the routing (default: the
                                                     # grouped down GEMM on compacted rows where measured faster)
    python bench/moe_bench.py --split-k 1            # no split-K MoE bucket (default: the heuristic's, below one
                                                     # row per expert; e.g. DeepSeek gate-up at M <= 2)
    # split-K before / after, DeepSeek per GEMM at M = 1 and 16 (the gate-up GEMM alone needs an unfused layer):
    python bench/moe_bench.py --models deepseek --m 1,16 --formats w4a16-int4-g128 --unfused-activation --split-k 1
    python bench/moe_bench.py --models deepseek --m 1,16 --formats w4a16-int4-g128 --unfused-activation
    python bench/moe_bench.py --unfused-activation   # torch's gated activation between the GEMMs (default: the
                                                     # layer fuses it into GEMM1 where it can, and then has no
                                                     # gate-up GEMM alone to time: those cells are skipped)

Formats per model by default: W4A16 int4 g128 everywhere, MXFP4 (w4a16-mxfp4) for gpt-oss, and the A8 formats of
the anchors (w4a8-mxfp4-fp8; w8a8-fp8-block128 for DeepSeek), skipped with the reason where QuantMoE refuses them.
Humming runs live for the W4A16 formats (--humming-formats). Past --budget seconds (240) the optional parts (Humming,
the torch MoE, eager times) are skipped, saying so. Markdown tables go to stdout, progress to stderr, every row
(tunings' token tiles, experts hit, bytes, errors) to DIR/moe_bench.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

SCHEMA = "humming_gen.moe_bench/1"
DEFAULT_LAYERS = 4
COPY_GBPS_H200 = 4245.0  # docs/BENCHMARKS.md: measured device-to-device copy on the H200
SAMPLE_ROWS = 8  # output rows per GEMM checked against float64


class Model(NamedTuple):
    title: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    activation: str
    gate_up_layout: str
    bias: bool
    ms: dict[str, tuple[int, ...]]  # per GEMM ("w13", "w2") and for the whole layer ("layer"; empty: not timed)
    formats: tuple[str, ...]
    anchor_file: str


ALL_MS = (1, 16, 128, 1024, 4096)
# switches of the warp-specialized pipeline for --ws-option, and their module under humming_gen.pipelines.warp_specialized
WS_OPTIONS = {"PREFETCH_CHUNK_ROWS": "compose", "RELEASE_FENCE": "components", "DEFERRED_RELEASE": "components",
              "PROXY_FENCE_AFTER_BULK": "components"}
MODELS = {
    "deepseek": Model("DeepSeek-V3 per rank (TP8)", 256, 8, 7168, 256, "silu_mul", "split", False,
                      {"w13": (1, 128, 4096), "w2": (1, 4096), "layer": (1, 128, 4096)},
                      ("w4a16-int4-g128", "w4a8-mxfp4-fp8", "w8a8-fp8-block128"), "h200_moe_graph.json"),
    "qwen3": Model("Qwen3-30B-A3B", 128, 8, 2048, 768, "silu_mul", "split", False,
                   {"w13": ALL_MS, "w2": ALL_MS, "layer": ALL_MS},
                   ("w4a16-int4-g128", "w4a8-mxfp4-fp8"), "h200_moe_qwen3_graph.json"),
    "gptoss": Model("gpt-oss-120b", 128, 4, 2880, 2880, "swiglu_oai", "interleaved", True,
                    {"w13": ALL_MS, "w2": ALL_MS, "layer": ALL_MS},
                    ("w4a16-int4-g128", "w4a16-mxfp4", "w4a8-mxfp4-fp8"), "h200_moe_gptoss_graph.json"),
}
GEMM_NAMES = {"w13": "gate-up", "w2": "down"}
ANCHOR_TAGS = {"w13": "gateup", "w2": "down"}

# Humming grouped-contiguous GEMMs on this H200 (CUDA graph, us per layer; /work/shared/anchors, 2026-11-30), at
# M = 1, 16, 128, 1024, 4096; a string: what Humming raised. Files found by --anchors replace these.
ANCHORS: dict[tuple[str, str, str], tuple[float, ...] | str] = {
    ("deepseek", "w4a16_int4_g128", "gateup"): (14.3, 59.3, 133.75, 207.21, 418.83),
    ("deepseek", "w4a8_mxfp4_fp8", "gateup"): (18.22, 58.64, 137.5, 221.74, 524.83),
    ("deepseek", "w8a8_fp8_block128", "gateup"): (18.7, 93.28, 222.88, 283.7, 522.18),
    ("deepseek", "w4a16_int4_g128", "down"): (10.66, 39.81, 85.1, 187.21, 474.85),
    ("deepseek", "w4a8_mxfp4_fp8", "down"): (19.06, 73.4, 164.3, 226.4, 474.35),
    ("deepseek", "w8a8_fp8_block128", "down"): (14.33, 62.68, 147.85, 201.42, 323.28),
    ("qwen3", "w4a16_int4_g128", "gateup"): (12.74, 51.42, 72.38, 139.25, 354.5),
    ("qwen3", "w4a8_mxfp4_fp8", "gateup"): (15.78, 44.06, 67.1, 106.26, 292.62),
    ("qwen3", "w4a16_int4_g128", "down"): (11.5, 26.62, 41.54, 84.26, 218.66),
    ("qwen3", "w4a8_mxfp4_fp8", "down"): (13.39, 28.58, 39.79, 80.26, 207.97),
    ("gptoss", "w4a16_mxfp4", "gateup"): (23.75, 172.31, 429.98, 570.29, 1235.7),
    ("gptoss", "w4a8_mxfp4_fp8", "gateup"): (40.72, 334.51, 866.7, 963.98, 1592.7),
    ("gptoss", "w4a16_mxfp4", "down"): "AssertionError()",
    ("gptoss", "w4a8_mxfp4_fp8", "down"): (36.86, 301.25, 780.4, 844.66, 1016.89),
}
ANCHOR_MS = ALL_MS

# Humming's weight and input configs (HummingLayer(weight_config=..., input_config=...)) per format
_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def short(e: BaseException, limit: int = 240) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:limit]


# --- plan and anchors (no GPU) ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from humming_gen.bench import parse_ms

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--m", default=None, help="token counts for every table (default: per model, see MODELS)")
    p.add_argument("--formats", default=None, help="presets for every model (default: per model)")
    p.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="distinct layers per timing (L2 rotation)")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--humming", default="grouped",
                   help="Humming GEMMs to time when importable: grouped, indexed, grouped,indexed or none")
    p.add_argument("--humming-formats", default="w4a16-int4-g128,w4a16-mxfp4",
                   help="formats timed with Humming too ('all': every format; the anchor column has the others)")
    p.add_argument("--budget", type=float, default=240.0,
                   help="seconds; past it the optional parts (Humming, the torch MoE, eager times) are skipped")
    p.add_argument("--no-torch", action="store_true", help="skip the bf16 torch MoE")
    p.add_argument("--no-layer", action="store_true", help="skip the whole-layer table")
    p.add_argument("--anchors", default=None, help="directory of the h200_moe*_graph.json anchor files")
    p.add_argument("--out", default=None, help="directory for moe_bench.json")
    p.add_argument("--dry-run", action="store_true", help="no GPU: print the plan, tiles and the anchor tables")
    p.add_argument("--unfused-activation", action="store_true",
                   help="QuantMoE(fused_activation=False): GEMM1 writes gate and up rows, torch applies the gated "
                        "activation (default: the layer's own choice, fused wherever the kernels can; a fused "
                        "layer refuses the gate-up GEMM alone, so its cells are skipped)")
    p.add_argument("--topk-reduce", default="deterministic", choices=("deterministic", "atomic"),
                   help="QuantMoE(topk_reduce=...): 'atomic' adds GEMM2's rows into fp32 token rows in its epilogue "
                        "(then the layer has no down GEMM alone: its per-GEMM cells are skipped)")
    p.add_argument("--split-k", default=None, type=int,
                   help="QuantMoE(split_k=...): 1 never splits K (before issue 11's split-K bucket), n > 1 splits "
                        "every standard-pipeline bucket n ways (default: the heuristic's split bucket)")
    p.add_argument("--down-gemm", default=None, choices=("indexed", "grouped_contiguous"),
                   help="QuantMoE(down_gemm=...): the whole layer's down GEMM through the routing or on GEMM1's rows "
                        "copied into per-expert windows (default: the heuristics' choice per bucket)")
    p.add_argument("--pipeline", default=None, choices=("standard", "warp_specialized"),
                   help="QuantMoE's indexed kernels all on this pipeline (default: the heuristics' choice per bucket)")
    p.add_argument("--ws-option", action="append", default=[], metavar="NAME=VALUE",
                   help=f"set a switch of the warp-specialized pipeline (its compose or components module) for the "
                        f"run, an int ({', '.join(WS_OPTIONS)}; repeatable), e.g. PREFETCH_CHUNK_ROWS=0, "
                        f"DEFERRED_RELEASE=0")
    args = p.parse_args(argv)
    options = {}
    for item in args.ws_option:
        name, _, value = item.partition("=")
        if name not in WS_OPTIONS or not value.lstrip("-").isdigit():
            p.error(f"--ws-option {item!r}: NAME=INT with NAME one of {', '.join(WS_OPTIONS)}")
        options[name] = int(value)
    args.ws_option = options
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in MODELS]
    if bad or not args.models:
        p.error(f"--models: unknown {bad}; allowed: {', '.join(MODELS)}")
    try:
        args.m = parse_ms("--m", args.m) if args.m else None
    except ValueError as e:
        p.error(str(e))
    if args.formats is not None:
        from humming_gen.schemes.presets import list_presets

        args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        unknown = [f for f in args.formats if f not in list_presets()]
        if unknown or not args.formats:
            p.error(f"--formats: unknown {unknown}; allowed: {', '.join(list_presets())}")
    args.humming = {h.strip() for h in args.humming.split(",") if h.strip() and h.strip() != "none"}
    args.humming_formats = None if args.humming_formats == "all" else \
        {f.strip() for f in args.humming_formats.split(",") if f.strip()}
    if not args.humming <= {"grouped", "indexed"}:
        p.error(f"--humming: {sorted(args.humming)}; allowed: grouped, indexed, none")
    if args.split_k is not None and args.split_k < 1:
        p.error(f"--split-k {args.split_k}: 1 (no split-K) or more")
    if args.layers < 1 or args.replays < 1:
        p.error("--layers and --replays must be positive")
    return args


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One entry per model: its formats and the M lists of each GEMM and of the whole layer."""
    out = []
    for name in args.models:
        model = MODELS[name]
        ms = {key: tuple(args.m) if args.m else value for key, value in model.ms.items()}
        if not model.ms["layer"] or args.no_layer:
            ms["layer"] = ()
        out.append(dict(model=name, spec=model, formats=tuple(args.formats or model.formats), ms=ms))
    return out


def load_anchors(directory: str | None) -> tuple[dict, str]:
    """The embedded ANCHORS, replaced by the anchor files where a directory holds them -> (anchors, source)."""
    anchors = dict(ANCHORS)
    here = Path(__file__).resolve().parent
    candidates = [Path(directory)] if directory else [here.parent / "shared" / "anchors", Path("/work/shared/anchors")]
    for folder in candidates:
        files = {name: folder / MODELS[name].anchor_file for name in MODELS}
        if not all(f.is_file() for f in files.values()):
            continue
        for name, path in files.items():
            per_key: dict[tuple[str, str, str], dict[int, Any]] = {}
            for row in json.loads(path.read_text()):
                key = (name, row["fmt"], row["tag"])
                per_key.setdefault(key, {})[row["m"]] = row.get("us", row.get("error"))
            for key, by_m in per_key.items():
                values = [by_m.get(m) for m in ANCHOR_MS]
                anchors[key] = values[0] if all(isinstance(v, str) for v in values) else tuple(values)
        return anchors, str(folder)
    return anchors, "embedded (docs: /work/shared/anchors, 2026-11-30)"


def anchor_for(anchors: dict, model: str, fmt: str, gemm: str, m: int) -> float | str | None:
    value = anchors.get((model, fmt.replace("-", "_"), ANCHOR_TAGS[gemm]))
    if value is None or isinstance(value, str):
        return value
    return value[ANCHOR_MS.index(m)] if m in ANCHOR_MS else None


def gemm_shape(model: Model, gemm: str) -> tuple[int, int]:
    """(N, K) of GEMM w13 (gate-up) or w2 (down)."""
    return (2 * model.intermediate, model.hidden) if gemm == "w13" else (model.hidden, model.intermediate)


def tiles(model: Model, fmt: str, ms: tuple[int, ...] = ALL_MS, target: str = "sm_90a",
          pipeline: str | None = None) -> dict[int, int] | str:
    """M -> the token tile QuantMoE's indexed kernels use (heuristics on `target`, or every bucket on `pipeline`),
    or why there is none."""
    import humming_gen as hg
    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.heuristics import choose_tunings, moe_tunings

    try:
        layers = [LayerConfig(n=n, k=k, scheme=hg.scheme(fmt), num_experts=model.experts, has_bias=model.bias,
                              dtype="bfloat16") for n, k in (gemm_shape(model, "w13"), gemm_shape(model, "w2"))]
        computes = [ComputeConfig(gemm="indexed"), ComputeConfig(gemm="indexed", topk_weight=True)]
        standard = [choose_tunings(layer, target, pipeline="standard") for layer in layers]
        buckets = moe_tunings(standard, layers, computes, target, pipeline=pipeline)[0].buckets
    except Exception as e:  # a format the MoE layer configs refuse for this shape
        return short(e)
    out = {}
    for m in ms:  # rows per expert M * top_k / E against the bounds (a fraction for the split-K bucket)
        out[m] = next(t.block_m for m_max, t in buckets if m_max is None or m * model.top_k <= m_max * model.experts)
    return out


# --- tables (no GPU) ----------------------------------------------------------------------------------------------
def _cell(row: dict | None, key: str = "graph_us") -> str:
    if row is None:
        return "-"
    if row.get("error"):
        return "err"
    value = row.get(key)
    return "-" if value is None else f"{value:.1f}"


def _find(rows: list[dict], **want: Any) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in want.items())), None)


GEMM_IMPLS = (("grouped", "grouped (ours)"), ("indexed", "indexed (ours)"),
              ("align+indexed", "align + indexed (ours)"), ("align", "align"),
              ("humming-grouped", "Humming grouped"), ("humming-indexed", "Humming indexed"))


def format_tables(results: dict[str, Any]) -> str:
    """Markdown: per model and format a per-GEMM table, per model a whole-layer table; errors and skips below."""
    rows, lines = results["rows"], []
    notes: dict[str, str] = {}
    for entry in results["plan"]:
        name, spec = entry["model"], MODELS[entry["model"]]
        head = f"{spec.title} (E = {spec.experts}, top-{spec.top_k}, H = {spec.hidden}, I = {spec.intermediate})"
        for fmt in entry["formats"]:
            skipped = next((s for s in results["skipped"] if (s["model"], s["format"], s["what"]) ==
                            (name, fmt, "QuantMoE")), None)
            if skipped:
                lines += ["", f"{head}, {fmt}: skipped ({skipped['reason']})"]
                continue
            mine = [r for r in rows if r["model"] == name and r["format"] == fmt and r["table"] == "gemm"]
            impls = [(key, label) for key, label in GEMM_IMPLS if any(r["impl"] == key for r in mine)] \
                or list(GEMM_IMPLS[:5])  # nothing measured (--dry-run): the planned columns
            options = "".join(f", {k}={v}" for k, v in results.get("ws_options", {}).items())
            lines += ["", f"### {head}, {fmt}: per GEMM, CUDA-graph us per layer (L = {results['layers']}{options})",
                      "| GEMM | M | experts hit | copy limit | " + " | ".join(label for _, label in impls)
                      + " | Humming anchor |", "|---|---|---|---|" + "---|" * (len(impls) + 1)]
            for gemm in ("w13", "w2"):
                n, k = gemm_shape(spec, gemm)
                for m in entry["ms"][gemm]:
                    base = _find(mine, gemm=gemm, m=m, impl="grouped") or {}
                    cells = []
                    for key, _ in impls:
                        r = _find(mine, gemm=gemm, m=m, impl=key)
                        if r is not None and r.get("error"):
                            notes.setdefault(f"{name} {fmt} {GEMM_NAMES[gemm]} {key}", r["error"])
                        cells.append(_cell(r))
                    anchor = anchor_for(results["anchors"], name, fmt, gemm, m)
                    anchor_cell = "-" if anchor is None else "err" if isinstance(anchor, str) else f"{anchor:.1f}"
                    limit = base.get("limit_us")
                    lines.append(f"| {GEMM_NAMES[gemm]} {n}x{k} | {m} | {base.get('experts_hit', '-')} | "
                                 f"{'-' if limit is None else f'{limit:.1f}'} | " + " | ".join(cells)
                                 + f" | {anchor_cell} |")
            errs: dict[str, float] = {}
            for r in mine:
                if r.get("rel_err") is not None:
                    errs[r["impl"]] = max(errs.get(r["impl"], 0.0), r["rel_err"])
            if errs:
                lines.append("max relative error of sampled rows vs float64: "
                             + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
        if not entry["ms"]["layer"]:
            continue
        mine = [r for r in rows if r["model"] == name and r["table"] == "layer"]
        refused = {s["format"] for s in results["skipped"] if s["model"] == name and s["what"] == "QuantMoE"}
        columns = ["torch-bf16"] + [f for f in entry["formats"] if f not in refused]
        floor = _find(mine, impl="torch-bf16")
        caption = (floor or {}).get("method", "bf16 torch MoE not run")
        lines += ["", f"### {head}: whole MoE layer, CUDA-graph us per layer / eager us per call (L = "
                      f"{results['layers']})", f"torch-bf16: {caption}",
                  "| M | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for m in entry["ms"]["layer"]:
            cells = []
            for impl in columns:
                r = _find(mine, impl=impl, m=m)
                if r is not None and r.get("error"):
                    notes.setdefault(f"{name} layer {impl}", r["error"])
                cells.append(_cell(r) if r is None or r.get("eager_us") is None
                             else f"{_cell(r)} / {r['eager_us']:.1f}")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        errs = {r["impl"]: r["rel_err"] for r in mine if r.get("rel_err") is not None}
        if errs:
            lines.append("relative error vs float64 (smallest M): "
                         + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    for s in results["skipped"]:
        if s["what"] != "QuantMoE":
            notes.setdefault(f"{s['model'] or ''} {s['format'] or ''} {s['what']}", s["reason"])
    if notes:
        lines += ["", "Errors and skips:"] + [f"- {k}: {v}" for k, v in notes.items()]
    lines.append(f"\nanchors: {results['anchor_source']}; copy limit = active experts' packed weights / "
                 f"{results['copy_gbps']:.0f} GB/s; gpt-oss rows of ours carry the checkpoint's biases, Humming's none")
    return "\n".join(lines)


def new_results(args: argparse.Namespace, entries: list[dict]) -> dict[str, Any]:
    from humming_gen import __version__

    anchors, source = load_anchors(args.anchors)
    return {"schema": SCHEMA, "humming_gen": __version__, "torch": torch.__version__, "gpu": None, "driver": None,
            "layers": args.layers, "replays": args.replays, "copy_gbps": COPY_GBPS_H200, "anchors": anchors,
            "ws_options": args.ws_option,
            "anchor_source": source, "plan": [{k: v for k, v in e.items() if k != "spec"} for e in entries],
            "rows": [], "skipped": []}


def write_json(results: dict[str, Any], out: str | None) -> None:
    if not out:
        return
    path = Path(out) / "moe_bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dict(results, anchors=[{"model": k[0], "format": k[1], "gemm": k[2], "us": v}
                                  for k, v in results["anchors"].items()])
    path.write_text(json.dumps(data, indent=1, default=str))
    log(f"wrote {path}")


def dry_run(args: argparse.Namespace, entries: list[dict]) -> dict[str, Any]:
    results = new_results(args, entries)
    for entry in entries:
        spec = entry["spec"]
        for fmt in entry["formats"]:
            t = tiles(spec, fmt, tuple(sorted(set(entry["ms"]["w13"]) | set(entry["ms"]["w2"]))),
                      pipeline=args.pipeline)
            what = t if isinstance(t, str) else ", ".join(f"M={m}: {bm}" for m, bm in t.items())
            log(f"plan {entry['model']} {fmt}: token tiles on sm_90a {what}")
        log(f"plan {entry['model']}: per-GEMM M {entry['ms']['w13']} / {entry['ms']['w2']}, "
            f"whole layer M {entry['ms']['layer'] or 'not timed'}")
    return results


# --- building layers (GPU) ----------------------------------------------------------------------------------------
def quantize_experts(scheme, experts: int, n: int, k: int, device: str = "cuda"):
    """scheme.quantize of a random (E, N, K) weight (randn * 0.02), in chunks of experts (quantization works in
    float64: whole gpt-oss experts at once would take tens of GB)."""
    from humming_gen.schemes import QuantizedWeight

    chunk = max(1, (1 << 27) // (n * k))
    parts = [scheme.quantize(torch.randn(min(chunk, experts - s), n, k, device=device) * 0.02)
             for s in range(0, experts, chunk)]
    if len(parts) == 1:
        return parts[0]

    def cat(field: str) -> torch.Tensor | None:
        tensors = [getattr(p, field) for p in parts]
        return None if tensors[0] is None else cat_experts(tensors)

    return QuantizedWeight(scheme, cat("codes"), cat("scales"), cat("zero_points"), cat("global_scale"))


def cat_experts(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat along the expert dimension; 1-byte float tensors (e8m0, e4m3 scales) through their bytes."""
    if len(tensors) == 1:
        return tensors[0]
    if tensors[0].element_size() == 1 and tensors[0].is_floating_point():
        return torch.cat([t.view(torch.uint8) for t in tensors]).view(tensors[0].dtype)
    return torch.cat(tensors)


class Batch(NamedTuple):
    """One routing of M tokens and the inputs every implementation reads for it."""

    m: int
    x: torch.Tensor  # (M, H) bf16
    ids: torch.Tensor  # (M, top_k) int32
    weights: torch.Tensor  # (M, top_k) fp32
    order: torch.Tensor  # (M * top_k,) assignments sorted by expert (stable)
    experts_sorted: torch.Tensor  # (M * top_k,) expert of each grouped row
    offsets: torch.Tensor  # (E + 1,) int32 start of each expert's rows in the grouped layout
    a13: torch.Tensor  # (M * top_k, H) grouped gate-up rows: x[order // top_k]
    act: torch.Tensor  # (M * top_k, I) down-GEMM input of assignment i (random)
    a2: torch.Tensor  # (M * top_k, I) grouped down rows: act[order]
    experts_hit: int


def make_batch(model: Model, m: int, seed: int, device: str = "cuda") -> Batch:
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(m, model.hidden, device=device, generator=g)).to(torch.bfloat16)
    scores = torch.softmax(torch.randn(m, model.experts, device=device, generator=g), dim=-1)
    weights, ids = torch.topk(scores, model.top_k, dim=-1)
    ids = ids.to(torch.int32)
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=model.experts)
    offsets = torch.zeros(model.experts + 1, dtype=torch.int32, device=device)
    offsets[1:] = torch.cumsum(counts, 0)
    act = (torch.randn(m * model.top_k, model.intermediate, device=device, generator=g)).to(torch.bfloat16)
    return Batch(m, x, ids, weights.float().contiguous(), order, flat[order], offsets,
                 x[order // model.top_k].contiguous(), act, act[order].contiguous(), int((counts > 0).sum()))


def rows_rel_err(y: torch.Tensor, a: torch.Tensor, experts: list[int], deq: Callable[[int], torch.Tensor],
                 bias: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> float:
    """Relative Frobenius error of output rows y[j] against a[j] @ W[experts[j]]^T (+ bias) (* scale) in float64."""
    ref = torch.stack([a[j].double() @ deq(e).double().T for j, e in enumerate(experts)])
    if bias is not None:
        ref = ref + bias[torch.tensor(experts, device=bias.device)].double()
    if scale is not None:
        ref = ref * scale.double()[:, None]
    return ((y.double() - ref).norm() / ref.norm()).item()


class TorchMoE:
    """A bf16 MoE in torch: sort the assignments by expert, torch._grouped_mm for both GEMMs (capturable: offsets
    from searchsorted, no host sync), the gated activation in fp32, router weights, index_add into fp32.
    loop=True: a loop over the experts with rows instead (reads the counts on the host: not capturable)."""

    def __init__(self, model: Model, w13: torch.Tensor, w2: torch.Tensor, bias13=None, bias2=None,
                 loop: bool = False):
        self.model, self.w13, self.w2, self.bias13, self.bias2, self.loop = model, w13, w2, bias13, bias2, loop
        self.bounds = torch.arange(1, model.experts + 1, device=w13.device, dtype=torch.int32)

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        from humming_gen.reference.moe import gated_activation

        spec = self.model
        flat = ids.reshape(-1)
        experts, order = torch.sort(flat, stable=True)
        tokens = order // spec.top_k
        a = x[tokens]
        ends = torch.searchsorted(experts, self.bounds, out_int32=True)  # end of each expert's rows

        def gemm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            if self.loop:
                out, start = a.new_empty(a.shape[0], w.shape[1]), 0
                for e, end in enumerate(ends.tolist()):
                    if end > start:
                        out[start:end] = a[start:end] @ w[e].T
                    start = end
            else:
                out = torch._grouped_mm(a, w.transpose(-2, -1), offs=ends)
            return out if bias is None else out + bias[experts]

        h = gemm(a, self.w13, self.bias13)
        act = gated_activation(h.float(), spec.activation, spec.gate_up_layout).to(x.dtype)
        y = gemm(act, self.w2, self.bias2).float() * weights.reshape(-1)[order, None]
        out = torch.zeros(x.shape[0], spec.hidden, dtype=torch.float32, device=x.device)
        return out.index_add_(0, tokens, y).to(x.dtype)


def reference_layer(model: Model, batch: Batch, deq13, deq2, bias13=None, bias2=None) -> torch.Tensor:
    """float64 reference_fused_moe on the experts this batch uses (dequantized one at a time)."""
    from humming_gen.reference.moe import reference_fused_moe

    used = torch.unique(batch.ids).tolist()
    remap = torch.full((model.experts,), -1, dtype=torch.long, device=batch.ids.device)
    remap[used] = torch.arange(len(used), device=batch.ids.device)
    index = torch.tensor(used, device=batch.ids.device)
    return reference_fused_moe(batch.x, torch.stack([deq13(e) for e in used]), torch.stack([deq2(e) for e in used]),
                               batch.weights, remap[batch.ids.long()], activation=model.activation,
                               gate_up_layout=model.gate_up_layout,
                               bias13=None if bias13 is None else bias13[index],
                               bias2=None if bias2 is None else bias2[index])


# --- timing (GPU) -------------------------------------------------------------------------------------------------
class Bench:
    """The timed cells of one run. device / target: "cuda" and the current GPU; a CPU test runs the same code with
    device="cpu", target="sm_90a" (kernels built, launches and timers stubbed) to check the plumbing."""

    def __init__(self, args: argparse.Namespace, results: dict[str, Any], device: str = "cuda",
                 target: str | None = None):
        from humming_gen.bench.report import device_limits

        self.args, self.results, self.device, self.target = args, results, device, target
        if device == "cuda":
            limits = device_limits(torch.cuda.get_device_name()) or {}
            results["copy_gbps"] = limits.get("memory_gbps", COPY_GBPS_H200)

    def over_budget(self, model: str | None, fmt: str | None, what: str) -> bool:
        """True (and the part skipped, saying so) once the run has used its --budget seconds."""
        elapsed = time.perf_counter() - _T0
        if elapsed <= self.args.budget:
            return False
        self.skip(model, fmt, what, f"time budget: {elapsed:.0f}s of --budget {self.args.budget:.0f}s used")
        return True

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def cell(self, base: dict[str, Any], fns: list[Callable], x: torch.Tensor, *, check: Callable | None = None,
             eager: bool = False) -> dict[str, Any]:
        """Time fns (one per layer) on x in one CUDA graph; a failure becomes the row's error, not the run's."""
        from humming_gen.bench.timing import eager_time_us, graph_time_us

        row = dict(base, graph_us=None, rel_err=None)
        if check is not None:
            try:  # a failing check (a reference the other library cannot give) leaves the timing to run
                row["rel_err"] = check()
            except Exception as e:
                row["check_error"] = short(e)
        try:
            row["graph_us"] = graph_time_us(fns, x, self.args.replays)
            self.sync()
        except Exception as e:
            row["error"] = short(e)
        if eager and time.perf_counter() - _T0 <= self.args.budget:
            try:  # also where the graph failed (a path that cannot be captured still has an eager time)
                row["eager_us"] = eager_time_us(fns, x, calls=200 if base["m"] <= 128 else 40)
                self.sync()
            except Exception as e:
                row["eager_error"] = short(e)
        self.results["rows"].append(row)
        timing = f"{row['graph_us']:.1f} us" if row["graph_us"] else f"failed ({row.get('error', '')[:120]})"
        err = f", err {row['rel_err']:.1e}" if row.get("rel_err") is not None else \
            f", check failed: {row['check_error'][:100]}" if row.get("check_error") else ""
        log(f"{base['model']} {base.get('format') or ''} {base.get('gemm') or 'layer'} {base['impl']} "
            f"M={base['m']}: {timing}{err}")
        return row

    def skip(self, model: str | None, fmt: str | None, what: str, reason: str) -> None:
        self.results["skipped"].append(dict(model=model, format=fmt, what=what, reason=reason))
        log(f"skipped {model or ''} {fmt or ''} {what}: {reason}")

    # --- humming_gen -----------------------------------------------------------------------------------------------
    def build_ours(self, name: str, model: Model, fmt: str):
        """L QuantMoE layers (the first one tells whether QuantMoE serves the format) and layer 0's weights."""
        import humming_gen as hg

        scheme = hg.scheme(fmt)
        fused = False if self.args.unfused_activation else None  # None: the layer's own choice
        layers, first = [], None
        for i in range(self.args.layers):
            torch.manual_seed(1000 * i + 7)
            q13 = quantize_experts(scheme, model.experts, 2 * model.intermediate, model.hidden, self.device)
            q2 = quantize_experts(scheme, model.experts, model.hidden, model.intermediate, self.device)
            b13 = b2 = None
            if model.bias:
                b13 = (torch.randn(model.experts, 2 * model.intermediate, device=self.device) * 0.1).bfloat16()
                b2 = (torch.randn(model.experts, model.hidden, device=self.device) * 0.1).bfloat16()
            t0 = time.perf_counter()
            layers.append(hg.QuantMoE.from_quantized(q13, q2, activation=model.activation,
                                                     gate_up_layout=model.gate_up_layout, bias13=b13, bias2=b2,
                                                     target=self.target, pipeline=self.args.pipeline,
                                                     fused_activation=fused, topk_reduce=self.args.topk_reduce,
                                                     split_k=self.args.split_k, down_gemm=self.args.down_gemm,
                                                     # None: cuda:<current> (a bare "cuda" differs from cuda:0)
                                                     device=None if self.device == "cuda" else self.device))
            log(f"{name} {fmt}: layer {i + 1}/{self.args.layers} built in {time.perf_counter() - t0:.1f}s")
            if i == 0:
                first = (q13, q2, b13, b2)
        return layers, first

    @staticmethod
    def gemms(layer) -> tuple[str, ...]:
        """The GEMMs of `layer` timed alone: a fused layer's w13 runs only with its activation, an atomic top-k
        reduction's w2 only within the layer (QuantMoE refuses them alone)."""
        return tuple(g for g, alone in (("w13", not layer.fused_activation), ("w2", layer.topk_reduce != "atomic"))
                     if alone)

    def warm_grouped(self, layer, entry: dict) -> None:
        """Compile the grouped kernels the timings will use, in parallel (they compile on first use otherwise)."""
        spec = entry["spec"]
        keys = {(gemm, -(-m * spec.top_k // spec.experts)) for gemm in self.gemms(layer) for m in entry["ms"][gemm]}
        if not keys:
            return
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(keys))) as pool:
            futures = [pool.submit(layer.grouped_launcher, gemm, "grouped_contiguous", rows) for gemm, rows in keys]
            errors = [short(f.exception()) for f in futures if f.exception() is not None]
        log(f"grouped kernels for {len(keys)} (GEMM, rows per expert) ready in {time.perf_counter() - t0:.1f}s"
            + (f"; {len(errors)} failed: {errors[0]}" if errors else ""))

    def run_ours(self, name: str, entry: dict, fmt: str, batches: dict[int, Batch]) -> None:
        import humming_gen as hg
        from humming_gen.layer.moe import expert_weight

        spec = entry["spec"]
        try:
            layers, (q13, q2, b13, b2) = self.build_ours(name, spec, fmt)
        except Exception as e:  # QuantMoE refuses the format (quantized activations) or the shape
            self.skip(name, fmt, "QuantMoE", short(e, 400))
            torch.cuda.empty_cache()
            return
        qs, biases = {"w13": q13, "w2": q2}, {"w13": b13, "w2": b2}
        cache: dict[tuple[str, int], torch.Tensor] = {}

        def deq(gemm: str) -> Callable[[int], torch.Tensor]:
            def get(e: int) -> torch.Tensor:
                if (gemm, e) not in cache:
                    cache[gemm, e] = expert_weight(qs[gemm], e).dequantize(torch.float32)
                return cache[gemm, e]
            return get

        self.warm_grouped(layers[0], entry)
        if layers[0].fused_activation and entry["ms"]["w13"]:
            self.skip(name, fmt, "gate-up GEMM alone", "the layer applies the gated activation in GEMM1's epilogue "
                      "(--unfused-activation times that GEMM alone)")
        if layers[0].topk_reduce == "atomic" and entry["ms"]["w2"]:
            self.skip(name, fmt, "down GEMM alone", "--topk-reduce atomic: the down GEMM adds into token rows, "
                      "timed within the whole layer only")
        per_expert = {"w13": layers[0].w13.nbytes() / spec.experts, "w2": layers[0].w2.nbytes() / spec.experts}
        for gemm in self.gemms(layers[0]):
            n, k = gemm_shape(spec, gemm)
            for m in entry["ms"][gemm]:
                b = batches[m]
                bm = layers[0].block_m(m, spec.top_k)
                routing = hg.moe_align(b.ids, spec.experts, bm)
                rows = m * spec.top_k
                sample = min(SAMPLE_ROWS, rows)
                base = dict(table="gemm", model=name, format=fmt, gemm=gemm, n=n, k=k, m=m, e=spec.experts,
                            top_k=spec.top_k, layers=len(layers), block_m=bm, experts_hit=b.experts_hit,
                            split_k=layers[0].split_ks[layers[0].bucket_for(m, spec.top_k)][gemm == "w2"],
                            weight_bytes=int(per_expert[gemm] * b.experts_hit),
                            limit_us=per_expert[gemm] * b.experts_hit / (self.results["copy_gbps"] * 1e3))
                grouped_in = b.a13 if gemm == "w13" else b.a2
                out_g = torch.empty(rows, n, dtype=torch.bfloat16, device=self.device)
                out_i = torch.empty(rows, n, dtype=torch.bfloat16, device=self.device)
                experts_g = b.experts_sorted[:sample].tolist()
                experts_i = b.ids.reshape(-1)[:sample].tolist()

                def grouped(a, layer, gemm=gemm, offsets=b.offsets, out=out_g):
                    return hg.grouped_moe_gemm(a, layer, gemm, offsets, layout="grouped_contiguous", out=out)

                if gemm == "w13":
                    def indexed(a, layer, r=routing, out=out_i, bm=bm):
                        return hg.moe_gemm(a, layer, "w13", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad,
                                           top_k=spec.top_k, block_m=bm, out=out)
                    index_in, a_rows = b.x, b.x[torch.arange(sample, device=b.x.device) // spec.top_k]
                    scale = None
                else:
                    flat_w = b.weights.reshape(-1)

                    def indexed(a, layer, r=routing, out=out_i, bm=bm, w=flat_w):
                        return hg.moe_gemm(a, layer, "w2", r.sorted_ids, r.expert_ids, r.num_tokens_post_pad,
                                           top_k=1, block_m=bm, topk_weights=w, out=out)
                    index_in, a_rows, scale = b.act, b.act[:sample], flat_w[:sample]

                def aligned(a, layer, indexed=indexed, bm=bm, ids=b.ids):
                    return indexed(a, layer, hg.moe_align(ids, spec.experts, bm))

                def check_grouped(gemm=gemm, a=grouped_in, ex=experts_g):
                    grouped(a, layers[0])
                    return rows_rel_err(out_g[:sample], a[:sample], ex, deq(gemm), biases[gemm])

                def check_indexed(gemm=gemm, a=index_in, ar=a_rows, ex=experts_i, scale=scale):
                    indexed(a, layers[0])
                    return rows_rel_err(out_i[:sample], ar, ex, deq(gemm), biases[gemm], scale)

                self.cell(dict(base, impl="grouped"), [lambda a, lay=lay: grouped(a, lay) for lay in layers],
                          grouped_in, check=check_grouped)
                self.cell(dict(base, impl="indexed"), [lambda a, lay=lay: indexed(a, lay) for lay in layers],
                          index_in, check=check_indexed)
                self.cell(dict(base, impl="align+indexed"), [lambda a, lay=lay: aligned(a, lay) for lay in layers],
                          index_in)
                self.cell(dict(base, impl="align"), [lambda a, ids=b.ids, bm=bm: hg.moe_align(ids, spec.experts, bm)]
                          * len(layers), index_in)
            cache.clear()

        def check_layer(b: Batch) -> float:
            ref = reference_layer(spec, b, deq("w13"), deq("w2"), b13, b2)
            return ((layers[0](b.x, b.weights, b.ids).double() - ref).norm() / ref.norm()).item()

        for m in entry["ms"]["layer"]:
            b = batches[m]
            checked = m == min(entry["ms"]["layer"]) and m * spec.top_k <= 64  # few experts to dequantize
            self.cell(dict(table="layer", model=name, format=fmt, impl=fmt, m=m, e=spec.experts, top_k=spec.top_k,
                           layers=len(layers), block_m=layers[0].block_m(m, spec.top_k),
                           fused_activation=layers[0].fused_activation),
                      [lambda x, lay=lay, b=b: lay(x, b.weights, b.ids) for lay in layers], b.x,
                      check=(lambda b=b: check_layer(b)) if checked else None, eager=True)
        layers.clear()  # free the weights before the next format
        cache.clear()
        torch.cuda.empty_cache()

    # --- Humming ---------------------------------------------------------------------------------------------------
    def humming_layers(self, fmt: str, e: int, n: int, k: int, pad: tuple[int, int]):
        """L HummingLayers of random (E, N, K) experts -> (layers, layer 0's quantized tensors, weight schema)."""
        from humming_gen.bench.humming import FORMATS as HUMMING_FORMATS
        from humming_gen.bench.humming import HummingUnavailable

        if fmt not in HUMMING_FORMATS:
            raise HummingUnavailable(f"no Humming mapping for {fmt}")
        try:
            from humming.layer import HummingLayer
            from humming.schema import HummingWeightSchema
        except Exception as exc:  # not installed, or its own dependencies missing
            raise HummingUnavailable(f"humming not importable: {short(exc)}") from exc
        weight_config, input_config = HUMMING_FORMATS[fmt]
        layers, tensors0 = [], None
        chunk = max(1, (1 << 27) // (n * k))
        for i in range(self.args.layers):
            layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(weight_config),
                                 input_config=dict(input_config) if input_config else None,
                                 pad_n_to_multiple=pad[0], pad_k_to_multiple=pad[1], num_experts=e,
                                 torch_dtype=torch.bfloat16).cuda()
            parts = [HummingWeightSchema.quant_tensor(
                (torch.randn(min(chunk, e - s), n, k, device="cuda") * 0.02).bfloat16(), layer.weight_schema,
                torch.bfloat16) for s in range(0, e, chunk)]
            tensors = {key: cat_experts([p[key] for p in parts]) if parts[0][key].dim() and
                       parts[0][key].shape[0] == min(chunk, e) else parts[0][key] for key in parts[0]}
            if i == 0:
                tensors0 = tensors
            layer.load_from_tensors(tensors)
            layer.transform()
            layers.append(layer)
        return layers, tensors0, layers[0].weight_schema

    def run_humming(self, name: str, entry: dict, fmt: str, batches: dict[int, Batch]) -> None:
        from humming_gen.bench.humming import HummingUnavailable

        spec = entry["spec"]
        for gemm in ("w13", "w2"):
            n, k = gemm_shape(spec, gemm)
            built, reasons = None, []
            for pad in ((1, 1), (256, 128)):  # Humming as is, then padded as vLLM pads it
                try:
                    layers, tensors0, schema = self.humming_layers(fmt, spec.experts, n, k, pad)
                    b = batches[min(entry["ms"][gemm])]
                    layers[0](b.a13 if gemm == "w13" else b.a2, expert_layout=b.offsets.long(),
                              compute_config={"gemm_type": "grouped_contiguous"})  # its heuristics may refuse
                    self.sync()
                    built = (layers, tensors0, schema, pad)
                    break
                except Exception as e:
                    reasons.append(str(e) if isinstance(e, HummingUnavailable) else f"pad {pad}: {short(e)}")
                    layers = tensors0 = None
                    torch.cuda.empty_cache()
                    if isinstance(e, HummingUnavailable):
                        break
            if built is None:
                self.skip(name, fmt, f"Humming {GEMM_NAMES[gemm]}", "; ".join(reasons))
                continue
            layers, tensors0, schema, pad = built
            log(f"Humming {name} {fmt} {GEMM_NAMES[gemm]}: {len(layers)} layers (pad N, K to {pad})")
            cache: dict[int, torch.Tensor] = {}

            def deq(e: int) -> torch.Tensor:
                if e not in cache:
                    part = {key: t[e:e + 1] if t.dim() and t.shape[0] == spec.experts else t
                            for key, t in tensors0.items()}
                    cache[e] = schema.dequant_tensors(part)[0].float()
                return cache[e]

            for m in entry["ms"][gemm]:
                b = batches[m]
                rows, sample = m * spec.top_k, min(SAMPLE_ROWS, m * spec.top_k)
                base = dict(table="gemm", model=name, format=fmt, gemm=gemm, n=n, k=k, m=m, e=spec.experts,
                            top_k=spec.top_k, layers=len(layers), humming_pad=list(pad))
                out = torch.empty(rows, n, dtype=torch.bfloat16, device=self.device)
                grouped_in = b.a13 if gemm == "w13" else b.a2
                offsets = b.offsets.long()

                def grouped(a, layer, offsets=offsets, out=out):
                    return layer(a, outputs=out, expert_layout=offsets,
                                 compute_config={"gemm_type": "grouped_contiguous"})

                def check_grouped(a=grouped_in, ex=b.experts_sorted[:sample].tolist()):
                    grouped(a, layers[0])
                    return rows_rel_err(out[:sample], a[:sample], ex, deq)

                if "grouped" in self.args.humming:
                    self.cell(dict(base, impl="humming-grouped"),
                              [lambda a, lay=lay: grouped(a, lay) for lay in layers], grouped_in, check=check_grouped)
                if "indexed" in self.args.humming:
                    self.humming_indexed(base, layers, b, gemm, out, deq, sample)
            layers = tensors0 = built = None
            cache.clear()
            torch.cuda.empty_cache()

    def humming_indexed(self, base: dict, layers: list, b: Batch, gemm: str, out: torch.Tensor, deq,
                        sample: int) -> None:
        """Humming's indexed GEMM on moe_align routing padded to the token tile of its own table (as vLLM looks it
        up); its GEMM2 does not multiply by router weights (Humming 0.1.20)."""
        import humming_gen as hg

        spec = MODELS[base["model"]]
        row = dict(base, impl="humming-indexed", graph_us=None)
        try:
            from humming.tune import get_heuristics_config

            top_k = spec.top_k if gemm == "w13" else 1
            shape_m = b.m * spec.top_k
            table = get_heuristics_config(layers[0].humming_config, gemm_type="indexed",
                                          device=torch.cuda.current_device())
            config = next(c for lo, hi, c in table if lo < shape_m and (hi <= 0 or shape_m <= hi))
            bm = config["block_shape"][0]
            routing = hg.moe_align(b.ids, spec.experts, bm)
            a = b.x if gemm == "w13" else b.act
        except Exception as e:
            row["error"] = short(e)
            self.results["rows"].append(row)
            log(f"Humming indexed {base['model']} {base['format']} {gemm} M={b.m}: {row['error']}")
            return

        def indexed(a, layer, r=routing):
            return layer(a, outputs=out, sorted_ids=r.sorted_ids, expert_ids=r.expert_ids,
                         num_tokens_padded=r.num_tokens_post_pad, top_k=top_k, compute_config={"gemm_type": "indexed"})

        def check():
            indexed(a, layers[0])
            a_rows = b.x[torch.arange(sample, device=b.x.device) // spec.top_k] if gemm == "w13" else b.act[:sample]
            return rows_rel_err(out[:sample], a_rows, b.ids.reshape(-1)[:sample].tolist(), deq)

        self.cell(dict(base, impl="humming-indexed", block_m=bm),
                  [lambda a, lay=lay: indexed(a, lay) for lay in layers], a, check=check)

    # --- torch bf16 ------------------------------------------------------------------------------------------------
    def run_torch(self, name: str, entry: dict, batches: dict[int, Batch]) -> None:
        spec = entry["spec"]
        layers = []
        try:
            for i in range(self.args.layers):
                torch.manual_seed(5000 + i)
                e, h, inter = spec.experts, spec.hidden, spec.intermediate
                w13 = (torch.randn(e, 2 * inter, h, device=self.device, dtype=torch.bfloat16) * 0.02)
                w2 = (torch.randn(e, h, inter, device=self.device, dtype=torch.bfloat16) * 0.02)
                b13 = (torch.randn(e, 2 * inter, device=self.device) * 0.1).bfloat16() if spec.bias else None
                b2 = (torch.randn(e, h, device=self.device) * 0.1).bfloat16() if spec.bias else None
                layers.append(TorchMoE(spec, w13, w2, b13, b2))
        except Exception as e:
            self.skip(name, None, "torch bf16 MoE", short(e))
            return
        method, capturable = "sort by expert, torch._grouped_mm x 2, index_add (CUDA graph)", True
        try:
            b = batches[min(entry["ms"]["layer"])]
            layers[0](b.x, b.weights, b.ids)
            self.sync()
        except Exception as e:
            log(f"torch._grouped_mm unavailable ({short(e)}): eager loop over experts instead")
            for lay in layers:
                lay.loop = True
            method = (f"eager loop over experts with rows (torch._grouped_mm: {short(e, 80)}); not capturable: "
                      f"synchronised wall clock per call")
            capturable = False
        lay0 = layers[0]

        def check_layer(b: Batch) -> float:
            ref = reference_layer(spec, b, lambda e: lay0.w13[e], lambda e: lay0.w2[e], lay0.bias13, lay0.bias2)
            return ((lay0(b.x, b.weights, b.ids).double() - ref).norm() / ref.norm()).item()

        for m in entry["ms"]["layer"]:
            b = batches[m]
            base = dict(table="layer", model=name, format=None, impl="torch-bf16", m=m, e=spec.experts,
                        top_k=spec.top_k, layers=len(layers), method=method)
            fns = [lambda x, lay=lay, b=b: lay(x, b.weights, b.ids) for lay in layers]
            check = (lambda b=b: check_layer(b)) if m == min(entry["ms"]["layer"]) and m * spec.top_k <= 64 else None
            if capturable:
                self.cell(base, fns, b.x, check=check, eager=True)
                continue
            from humming_gen.bench.timing import eager_time_us

            row = dict(base, graph_us=None, rel_err=None)
            try:
                row["rel_err"] = check() if check else None
            except Exception as e:
                row["check_error"] = short(e)
            try:
                row["eager_us"] = eager_time_us(fns, b.x, calls=20)
            except Exception as e:
                row["error"] = short(e)
            self.results["rows"].append(row)
            log(f"{name} layer torch-bf16 (eager loop) M={m}: {row.get('eager_us')}")
        layers.clear()
        torch.cuda.empty_cache()


def run(args: argparse.Namespace, entries: list[dict]) -> dict[str, Any]:
    from humming_gen.tuning.store import device_identity

    if not torch.cuda.is_available():
        raise SystemExit("moe_bench: no CUDA GPU here (torch.cuda.is_available() is False); --dry-run shows the plan")
    results = new_results(args, entries)
    results["gpu"], results["driver"] = device_identity() or (torch.cuda.get_device_name(), "?")
    bench = Bench(args, results)
    for entry in entries:
        name, spec = entry["model"], entry["spec"]
        all_ms = sorted(set(entry["ms"]["w13"]) | set(entry["ms"]["w2"]) | set(entry["ms"]["layer"]))
        batches = {m: make_batch(spec, m, seed=m) for m in all_ms}
        for fmt in entry["formats"]:
            log(f"=== {name} {fmt}")
            bench.run_ours(name, entry, fmt, batches)
            refused = any((s["model"], s["format"], s["what"]) == (name, fmt, "QuantMoE") for s in results["skipped"])
            wanted = args.humming_formats is None or fmt in args.humming_formats
            if args.humming and wanted and not refused and not bench.over_budget(name, fmt, "Humming"):
                bench.run_humming(name, entry, fmt, batches)
        if entry["ms"]["layer"] and not args.no_torch and not bench.over_budget(name, None, "torch bf16 MoE"):
            log(f"=== {name} torch bf16")
            bench.run_torch(name, entry, batches)
        del batches
        torch.cuda.empty_cache()
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.ws_option:
        import importlib

        for name, value in args.ws_option.items():
            module = importlib.import_module(f"humming_gen.pipelines.warp_specialized.{WS_OPTIONS[name]}")
            setattr(module, name, type(getattr(module, name))(value))
    entries = plan(args)
    results = dry_run(args, entries) if args.dry_run else run(args, entries)
    write_json(results, args.out)
    print(format_tables(results), flush=True)
    log(f"done in {time.perf_counter() - _T0:.0f}s")


if __name__ == "__main__":
    main()
