#!/usr/bin/env bash
# Session 16, call 5: the GPU test files whose expectations changed with W8A8 MoE on the warp-specialized pipeline.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HUMMING_GEN_CACHE_DIR=/tmp/hg-cache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/whl.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -e . --no-deps --no-build-isolation > "$OUT/install.log" 2>&1 || tail -n 3 "$OUT/install.log"
T0=$SECONDS
timeout 300 python3 -m pytest tests/gpu/test_quant_moe_a8_ws.py tests/gpu/test_quant_moe_batch_invariance.py \
  tests/gpu/test_quant_moe_fused_quant.py tests/gpu/test_quant_moe_grouped_ws.py tests/gpu/test_quant_moe_a8.py \
  -v -p no:cacheprovider -n 8 > "$OUT/tests.log" 2>&1
echo "tests rc=$? in $((SECONDS-T0)) s: $(grep -c PASSED "$OUT/tests.log") passed, $(grep -c FAILED "$OUT/tests.log") failed"
grep -E "^FAILED" "$OUT/tests.log" | head -20; grep -E "^E  .*(Error|assert)" "$OUT/tests.log" | sort | uniq -c | head; tail -n 2 "$OUT/tests.log"
T0=$SECONDS
timeout 95 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 python3 bench/sanitize_moe.py > "$OUT/memcheck-moe.log" 2>&1
echo "memcheck moe rc=$? $((SECONDS-T0)) s: $(grep -E 'ERROR SUMMARY|sanitize moe' "$OUT/memcheck-moe.log" | tr '\n' ' ')"
