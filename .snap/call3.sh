#!/usr/bin/env bash
# Session 16, call 3: DeepSeek / Qwen3 MoE GEMMs, standard vs warp-specialized small tiles; 8-bit small tiles; racecheck.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HUMMING_GEN_CACHE_DIR=/tmp/hg-cache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/whl.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -e . --no-deps --no-build-isolation > "$OUT/install.log" 2>&1 || tail -n 3 "$OUT/install.log"
for pipe in standard warp_specialized; do
  T0=$SECONDS
  timeout 110 python3 bench/moe_bench.py --models deepseek,qwen3 --m 1,16,128 --formats w4a16-int4-g128,w4a8-mxfp4-fp8,w8a8-fp8-block128 --unfused-activation --humming none --no-layer --no-torch --pipeline $pipe > "$OUT/pipe-$pipe.log" 2> "$OUT/pipe-$pipe.err"
  echo "== $pipe rc=$? $((SECONDS-T0)) s"; grep "^|" "$OUT/pipe-$pipe.log" | grep -v "| - |\|---\|GEMM |" 
done
T0=$SECONDS
(cd bench && timeout 120 python3 moe_small_tiles.py --models deepseek --formats w8a8-fp8-block128,w4a16-int4-g128 --m 16,128 > "$OUT/small8.log" 2>&1)
echo "small tiles rc=$? $((SECONDS-T0)) s"; grep "^|" "$OUT/small8.log" | tail -n 40
T0=$SECONDS
timeout 200 compute-sanitizer --tool racecheck --report-api-errors no --print-limit 20 python3 bench/sanitize_moe.py > "$OUT/racecheck-moe.log" 2>&1
echo "racecheck moe rc=$? $((SECONDS-T0)) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|sanitize moe' "$OUT/racecheck-moe.log" | tr '\n' ' ')"
