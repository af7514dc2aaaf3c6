#!/usr/bin/env bash
# Session 16, call 2: whole MoE layer beside the bf16 torch MoE (Qwen3, gpt-oss), DeepSeek GEMM table, acluster probe.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HUMMING_GEN_CACHE_DIR=/tmp/hg-cache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/whl.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -e . --no-deps --no-build-isolation > "$OUT/install.log" 2>&1 || tail -n 3 "$OUT/install.log"
T0=$SECONDS
timeout 290 python3 bench/moe_bench.py --models qwen3,gptoss --humming none --budget 250 --out "$OUT/layer" > "$OUT/layer.log" 2> "$OUT/layer.err"
echo "layer rc=$? $((SECONDS-T0)) s"; grep "^|\|^#\|^[A-Z]" "$OUT/layer.log" | tail -n 60
T0=$SECONDS
timeout 150 python3 bench/moe_bench.py --models deepseek --m 1,128,4096 --unfused-activation --humming none --no-layer --no-torch --out "$OUT/deepseek" > "$OUT/deepseek.log" 2> "$OUT/deepseek.err"
echo "deepseek rc=$? $((SECONDS-T0)) s"; grep "^|" "$OUT/deepseek.log" | tail -n 30
T0=$SECONDS
(cd bench && timeout 100 python3 a8_sweep.py w4a8-mxfp4-fp8 256,1024 acluster > "$OUT/acluster.log" 2>&1)
echo "acluster rc=$? $((SECONDS-T0)) s"; grep "^|" "$OUT/acluster.log" | tail -n 20
