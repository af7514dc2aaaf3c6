"""SASS of one MoE bucket's indexed GEMM1 kernel, compiled on the CPU (no GPU): the kernel QuantMoE runs for a model's
gate-up GEMM at a given number of rows per expert, and an instruction histogram of its hottest loop (the largest
backward branch). Needs cuobjdump (PyPI wheel nvidia-cuda-cuobjdump, or on PATH), as scripts/sass.py.

    python bench/moe_bucket_sass.py [--scheme w4a8-mxfp4-fp8] [--shape 128,2048,768] [--rows 8]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

import humming_gen as hg
from humming_gen.codegen import compose
from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import choose_tunings, moe_tunings
from humming_gen.kernel import build_many
from humming_gen.runtime.cache import _cuda_tool
from humming_gen.targets import get_target


def hottest_loop(sass: str) -> tuple[int, collections.Counter]:
    """(instructions, opcode histogram) of the longest backward branch's body."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
           re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            loops.append((i - index[int(m.group(1), 16)], index[int(m.group(1), 16)], i))
    if not loops:
        return 0, collections.Counter()
    n, start, end = max(loops)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for _, t in ins[start:end + 1])
    return n + 1, ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", default="w4a8-mxfp4-fp8")
    ap.add_argument("--shape", default="128,2048,768", help="experts, hidden, intermediate (Qwen3-30B-A3B)")
    ap.add_argument("--rows", type=float, default=8.0, help="rows per expert (M x top-k / E) picking the bucket")
    ap.add_argument("--target", default="sm_90a")
    args = ap.parse_args()
    e, h, i = (int(v) for v in args.shape.split(","))
    target = get_target(args.target)
    layers = [LayerConfig(n=n, k=k, scheme=hg.scheme(args.scheme), num_experts=e, dtype="bfloat16")
              for n, k in ((2 * i, h), (h, i))]
    computes = [ComputeConfig(gemm="indexed"), ComputeConfig(gemm="indexed", topk_weight=True)]
    standard = [choose_tunings(layer, target, pipeline="standard") for layer in layers]
    buckets = moe_tunings(standard, layers, computes, target)[0].buckets
    tuning = next(t for m_max, t in buckets if m_max is None or args.rows <= m_max)
    kernel = build_many([compose(layers[0], computes[0], tuning, target)], compiler="nvrtc")[0]
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "kernel.cubin"
        cubin.write_bytes(kernel.compiled.cubin)
        sass = subprocess.run([_cuda_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    n, ops = hottest_loop(sass)
    print(f"{kernel.name}\n{tuning}\nresources {kernel.resources}")
    print(f"hottest loop: {n} instructions: " + ", ".join(f"{op} {c}" for op, c in ops.most_common(16)))


if __name__ == "__main__":
    main()
