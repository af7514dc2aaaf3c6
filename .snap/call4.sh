#!/usr/bin/env bash
# Session 16, call 4: GPU tests after slice_stages (k tiles + 1) and W8A8 MoE on the warp-specialized pipeline at every
# bucket; DeepSeek / Qwen3 tables with the new defaults, and Qwen3 W8A8 standard vs default.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HUMMING_GEN_CACHE_DIR=/tmp/hg-cache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/whl.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -e . --no-deps --no-build-isolation > "$OUT/install.log" 2>&1 || tail -n 3 "$OUT/install.log"
T0=$SECONDS
timeout 270 python3 -m pytest tests/gpu/test_quant_moe.py tests/gpu/test_quant_moe_a8.py tests/gpu/test_quant_moe_a8_ws.py \
  tests/gpu/test_quant_moe_edges.py tests/gpu/test_quant_moe_split_k.py tests/gpu/test_quant_moe_ops.py \
  tests/gpu/test_quant_moe_fused_quant.py tests/gpu/test_quant_moe_batch_invariance.py tests/gpu/test_moe_checkpoints.py \
  tests/gpu/test_quant_moe_grouped_ws.py tests/gpu/test_linear.py tests/gpu/test_linear_w8a8.py tests/gpu/test_linear_w4a8.py \
  -v -p no:cacheprovider -n 8 > "$OUT/tests.log" 2>&1
echo "tests rc=$? in $((SECONDS-T0)) s: $(grep -c PASSED "$OUT/tests.log") passed, $(grep -c FAILED "$OUT/tests.log") failed"
grep -E "^FAILED" "$OUT/tests.log" | head -20; tail -n 2 "$OUT/tests.log"
T0=$SECONDS
timeout 90 python3 bench/moe_bench.py --models deepseek --m 1,16,128,4096 --formats w4a16-int4-g128,w4a8-mxfp4-fp8,w8a8-fp8-block128 --unfused-activation --humming none --no-layer --no-torch > "$OUT/deepseek.log" 2> "$OUT/deepseek.err"
echo "deepseek rc=$? $((SECONDS-T0)) s"; grep "^|" "$OUT/deepseek.log" | grep -v "| - |\|---\|GEMM |"
for pipe in standard default; do
  T0=$SECONDS; P=$([ $pipe = standard ] && echo "--pipeline standard")
  timeout 80 python3 bench/moe_bench.py --models qwen3 --m 1,16,128 --formats w8a8-fp8-channel,w8a8-int8-channel,w8a8-fp8-block128 --unfused-activation --humming none --no-layer --no-torch $P > "$OUT/q8-$pipe.log" 2> "$OUT/q8-$pipe.err"
  echo "== qwen3 w8a8 $pipe rc=$? $((SECONDS-T0)) s"; grep "^|" "$OUT/q8-$pipe.log" | grep -v "| - |\|---\|GEMM |"
done
