"""Disassemble one generated kernel: the M bucket's kernel of a preset layer, compiled for a target, with an
instruction histogram of its hottest loop. Needs cuobjdump ($CUOBJDUMP, on PATH or from the wheel) and the nvdisasm it calls;
both come as PyPI wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm).

    python scripts/sass.py --scheme w4a16-int4-g128 --m 1 [--target sm_90a] [--loop | --full] [--fold-scales]
    python scripts/sass.py --scheme w4a8-mxfp4-fp8 --moe 128,2048,768 --rows 8   # an MoE bucket's GEMM1 kernel

With --moe experts,hidden,intermediate the kernel is the indexed gate-up GEMM QuantMoE runs in the bucket of --rows
rows per expert (M x top-k / E), as the MoE heuristics choose it (Qwen3-30B-A3B: 128,2048,768).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings, moe_tunings
from humming_gen.kernel import build_many
from humming_gen.runtime.cache import _cuda_tool
from humming_gen.targets import get_target


def moe_gate_up_kernel(args: argparse.Namespace, target):
    """The indexed gate-up kernel of an MoE layer's bucket for args.rows rows per expert (moe_tunings' buckets)."""
    e, h, i = (int(v) for v in args.moe.split(","))
    layers = [LayerConfig(n=n, k=k, scheme=hg.scheme(args.scheme), num_experts=e, fold_scales=args.fold_scales)
              for n, k in ((2 * i, h), (h, i))]
    computes = [ComputeConfig(gemm="indexed"), ComputeConfig(gemm="indexed", topk_weight=True)]
    standard = [choose_tunings(layer, target, pipeline="standard") for layer in layers]
    buckets = moe_tunings(standard, layers, computes, target)[0].buckets
    tuning = next(t for m_max, t in buckets if m_max is None or args.rows <= m_max)
    print(tuning)
    return build_many([compose(layers[0], computes[0], tuning, target)], compiler="nvrtc")[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="w4a16-int4-g128")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--tuning", default=None, help="TuningConfig fields as JSON, overriding the bucket's")
    ap.add_argument("--fold-scales", action="store_true", help="LayerConfig.fold_scales (folded e8m0 group scales)")
    ap.add_argument("--full", action="store_true", help="print the whole disassembly")
    ap.add_argument("--loop", action="store_true", help="print the hottest loop")
    ap.add_argument("--moe", default=None, help="experts,hidden,intermediate: an MoE layer's indexed gate-up GEMM")
    ap.add_argument("--rows", type=float, default=8.0, help="with --moe: rows per expert, which pick the bucket")
    args = ap.parse_args()
    target = get_target(args.target)
    if args.moe:
        kernel = moe_gate_up_kernel(args, target)
    else:
        layer = LayerConfig(n=args.n, k=args.k, scheme=hg.scheme(args.scheme), fold_scales=args.fold_scales)
        tuning = choose_tunings(layer, target).for_m(args.m)
        if args.tuning:
            import json

            import attrs
            tuning = attrs.evolve(tuning, **json.loads(args.tuning))
        kernel = hg.compile(layer, tuning_config=tuning, target=target)
    tool = os.environ.get("CUOBJDUMP") or _cuda_tool("cuobjdump")  # (PATH, else the NVIDIA wheels' bin folders)
    if tool is None:
        raise SystemExit("cuobjdump not found: set $CUOBJDUMP")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.compiled.cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    print(kernel.name, kernel.resources)
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
    if args.full:
        print("\n".join(lines))
    # the hottest loop: the longest backward branch's body
    def addr(line: str) -> int:
        return int(re.match(r"\s+/\*([0-9a-f]+)\*/", line).group(1), 16)

    best = (0, 0)
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", ln)
        if m and m.group(1):
            target_addr = int(m.group(1), 16)
            start = next((j for j, l2 in enumerate(lines) if addr(l2) == target_addr), None)
            if start is not None and start < i and i - start > best[1] - best[0]:
                best = (start, i)
    body = lines[best[0]: best[1] + 1]
    if args.loop:
        print("\n".join(ln.split(";")[0] for ln in body))
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", ln.split("*/", 1)[1].strip()).split()[0].split(".")[0]
                              for ln in body)
    print(f"hot loop: {len(body)} instructions, {ops.get('HMMA', 0)} HMMA")
    for op, c in ops.most_common(16):
        print(f"  {op:10s} {c}")


if __name__ == "__main__":
    main()
