#!/usr/bin/env bash
# Nsight Compute on MoE GEMMs (issue 11's cells behind Humming): bench/profile_moe_pair.py runs the indexed GEMM three
# times, then the grouped one three times; this profiles the third launch of the one asked for (the L2 then holds
# little of its experts' weights). Speed of light, tensor pipe, memory, warp stalls, scheduler.
# Usage (GPU machine, repository root, project installed):
#   scripts/ncu_moe.sh scheme:M:gemm:experts,top_k,hidden,intermediate:indexed|grouped ...
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
for cell in "$@"; do
  IFS=: read -r scheme m gemm shape which <<< "$cell"
  skip=2; [ "$which" = grouped ] && skip=5
  log="$OUT/ncu-moe-$scheme-m$m-$gemm-${shape//,/x}-$which.txt"
  timeout 240 ncu --clock-control none -k regex:^gemm --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
    --print-details all --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_ldgsts.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    python3 bench/profile_moe_pair.py --scheme "$scheme" --m "$m" --gemm "$gemm" --shape "$shape" > "$log" 2>&1
  echo "== ncu $cell (rc=$?)"
  grep -E "^  [a-z_]+gemm|profile pair|Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|pipe_tensor|pipe_alu|ldgsts|dram__bytes|Grid Size|Block Size|Shared Memory Config" "$log" | head -30
done
