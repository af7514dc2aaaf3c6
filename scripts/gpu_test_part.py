"""Print the GPU test files of one part of the suite, for a device call too short for all of it.

    python scripts/gpu_test_part.py 1/2     # the first of two parts

Files are dealt to parts by their collected test counts (largest first, each to the part with the fewest tests so
far), so the parts hold about as many tests each; a file is never split. Deterministic for a given checkout.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys


def parts(counts: dict[str, int], n: int) -> list[list[str]]:
    bins: list[list[str]] = [[] for _ in range(n)]
    load = [0] * n
    for name, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        i = load.index(min(load))
        bins[i].append(name)
        load[i] += c
    return [sorted(b) for b in bins]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", help="I/N: part I of N parts, 1 <= I <= N (e.g. 1/2)")
    args = parser.parse_args()
    try:
        i, n = (int(v) for v in args.part.split("/"))
        if not 1 <= i <= n:
            raise ValueError
    except ValueError:
        parser.error(f"part must be I/N with 1 <= I <= N (e.g. 1/2), got {args.part!r}")
    collect = [sys.executable, "-m", "pytest", "tests/gpu", "--collect-only", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run(collect, capture_output=True, text=True).stdout
    counts = collections.Counter(line.split("::")[0] for line in out.splitlines() if "::" in line)
    if not counts:
        raise SystemExit("no GPU tests collected:\n" + out[-2000:])
    part = parts(dict(counts), n)[i - 1]
    if not part:  # (an empty list would leave gpu_check.sh's default: the whole suite)
        parser.error(f"part {i}/{n}: more parts than the {len(counts)} GPU test files")
    print(" ".join(part))


if __name__ == "__main__":
    main()
