#!/usr/bin/env bash
# Nsight Compute profiles of the issue-10 cells (8192 x 8192, one launch each, the third of three layers so that the
# L2 holds none of its weights): speed of light, memory and compute workload, warp stalls, scheduler.
# Usage (GPU machine, repository root, project installed): scripts/ncu_profile.sh [scheme:M ...]
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
cells=("$@")
[ ${#cells[@]} -eq 0 ] && cells=(w8a8-fp8-channel:8192 w4a8-mxfp4-fp8:8192 w8a8-fp8-block128:8192 w8a8-fp8-channel:1)
for cell in "${cells[@]}"; do
  scheme=${cell%%:*}; m=${cell##*:}
  log="$OUT/ncu-$scheme-m$m.txt"
  timeout 150 ncu --clock-control none -k regex:^gemm --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    python3 bench/profile_sample.py --scheme "$scheme" --m "$m" > "$log" 2>&1
  echo "== ncu $scheme M=$m (rc=$?)"
  grep -E "^  [a-z_]+gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Achieved Occupancy" "$log" | head -20
done
