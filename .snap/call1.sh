#!/usr/bin/env bash
# Session 16, call 1: MoE suites with the 16-row small tiles (numerics), memcheck dense sample, racecheck MoE sample.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HUMMING_GEN_CACHE_DIR=/tmp/hg-cache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/whl.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -e . --no-deps --no-build-isolation > "$OUT/install.log" 2>&1 || tail -n 3 "$OUT/install.log"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 -c "import xdist, compressed_tensors, humming; print('imports ok')" 2>&1 | tail -1
T0=$SECONDS
timeout 320 python3 -m pytest tests/gpu/test_quant_moe.py tests/gpu/test_quant_moe_a8.py tests/gpu/test_quant_moe_edges.py \
  tests/gpu/test_quant_moe_fold.py tests/gpu/test_quant_moe_fused_quant.py tests/gpu/test_quant_moe_batch_invariance.py \
  tests/gpu/test_quant_moe_split_k.py tests/gpu/test_quant_moe_topk_atomic.py tests/gpu/test_quant_moe_ops.py \
  tests/gpu/test_moe_checkpoints.py tests/gpu/test_moe_align.py \
  -v -p no:cacheprovider -n 8 > "$OUT/moe-tests.log" 2>&1
echo "moe suites rc=$? in $((SECONDS-T0)) s: $(grep -c PASSED "$OUT/moe-tests.log") passed, $(grep -c FAILED "$OUT/moe-tests.log") failed"
grep -E "^FAILED|Error" "$OUT/moe-tests.log" | head -20
tail -n 3 "$OUT/moe-tests.log"
T0=$SECONDS
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 python3 bench/sanitize_sample.py > "$OUT/memcheck-dense.log" 2>&1
echo "memcheck dense rc=$? $((SECONDS-T0)) s: $(grep -E 'ERROR SUMMARY|sanitize sample' "$OUT/memcheck-dense.log" | tr '\n' ' ')"
T0=$SECONDS
timeout 100 compute-sanitizer --tool racecheck --report-api-errors no --print-limit 20 python3 bench/sanitize_moe.py > "$OUT/racecheck-moe.log" 2>&1
echo "racecheck moe rc=$? $((SECONDS-T0)) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|sanitize moe' "$OUT/racecheck-moe.log" | tr '\n' ' ')"
