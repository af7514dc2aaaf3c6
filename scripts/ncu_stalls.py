"""Where a kernel's warps stall, instruction by instruction: reads the CSV that
`ncu -i REPORT --page source --csv --print-source sass` writes for a report taken with `--section SourceCounters`
(warp stall sampling), and prints the stall reasons over all samples, the hottest instructions with their top
reasons, and the share of samples between given instruction indices (e.g. a consumer's mainloop, its epilogue
and the producer, found by reading the listing with --list).

    python scripts/ncu_stalls.py kernel.sass.csv [--kernel 0] [--top 40] [--regions 100,172,1640] [--list]
"""

from __future__ import annotations

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40, help="hottest instructions to list")
    ap.add_argument("--regions", default="", help="instruction indices that split the listing into regions")
    ap.add_argument("--list", action="store_true", help="print every instruction with its samples")
    ap.add_argument("--kernel", type=int, default=0, help="which profiled kernel of the report (launch order)")
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] + [len(rows)]
    print(" ".join(rows[starts[args.kernel]][:2]))
    section = rows[starts[args.kernel] + 1:starts[args.kernel + 1]]
    header = next(r for r in section if SAMPLES in r)
    body = section[section.index(header) + 1:]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = [int(r[col[SAMPLES]] or 0) for r in body]
    total = sum(samples) or 1

    def by_reason(part: list) -> dict:
        count = collections.Counter()
        for r in part:
            for h in reasons:
                count[h[6:]] += int(r[col[h]] or 0)
        return {k: round(100 * v / total, 1) for k, v in count.most_common(6)}

    print(f"samples {total}; stall reasons (% of all samples): {by_reason(body)}")
    hottest = sorted(range(len(body)), key=lambda i: -samples[i])[:args.top]
    for i in range(len(body)) if args.list else sorted(hottest):
        top = sorted(((int(body[i][col[h]] or 0), h[6:]) for h in reasons), reverse=True)[:3]
        print(f"{i:5d} {100 * samples[i] / total:5.1f}% {body[i][col['Source']].strip()[:70]:70s} {top}")
    bounds = [int(b) for b in args.regions.split(",") if b]
    for a, b in zip([0] + bounds, bounds + [len(body)]):
        print(f"[{a}, {b}): {100 * sum(samples[a:b]) / total:5.1f}% {by_reason(body[a:b])}")


if __name__ == "__main__":
    main()
