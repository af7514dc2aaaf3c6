#!/usr/bin/env bash
# One device call: install the project, run the GPU tests, the sanitizers on a sample, and the benchmark.
# Usage (on a GPU machine, from the repository root): scripts/gpu_check.sh [pytest -k expression]
# Full results land in $OUT (default ./out); the short benchmark table is printed last.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HUMMING_GEN_CACHE_DIR=${HUMMING_GEN_CACHE_DIR:-/tmp/hg-cache}
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}; fi
python3 -m pip install -e . --no-deps --no-build-isolation > "$OUT/install.log" 2>&1 || tail -n 5 "$OUT/install.log"
export PYTHONPATH=$PWD:${PYTHONPATH:-}  # the checkout wins even where the editable install could not be made
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
# pytest-xdist (when installed) runs the GPU tests 8 at a time on the one GPU: about 4 minutes for the whole suite
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${HG_XDIST:-8}")
python3 -m pytest tests/gpu -q -p no:cacheprovider $XDIST ${1:+-k "$1"} --junitxml="$OUT/gpu-tests.xml" 2>&1 | tail -n 40 | tee "$OUT/gpu-tests.log"
if [ "${HG_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck; do
    # NOTE: --report-api-errors no: cuda-bindings probes driver entry points that do not exist (benign host API
    # errors); kernel memory errors and races are still reported.
    compute-sanitizer --tool $tool --report-api-errors no --print-limit 20 python3 bench/sanitize_sample.py \
      > "$OUT/sanitize-$tool.log" 2>&1
    echo "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize sample' "$OUT/sanitize-$tool.log" | tr '\n' ' ')"
  done
fi
if [ "${HG_SMOKE:-1}" = 1 ]; then  # the benchmark command, the example and the MoE timing, briefly
  python3 -m humming_gen.cli bench --formats w4a16-int4-g128 --shapes 4096x4096 --m 1,64,1024 --out "$OUT/cli-bench" \
    > "$OUT/cli-bench.log" 2>&1; echo "humming-gen bench: rc=$? ($(tail -n 1 "$OUT/cli-bench.log"))"
  python3 examples/quantize_model.py > "$OUT/example.log" 2>&1; echo "examples/quantize_model.py: rc=$?"
  (cd bench && python3 moe_timing.py 2>&1 | grep -v compil | tee "$OUT/moe-timing.log")
fi
if [ "${HG_BENCH:-1}" = 1 ]; then
  python3 bench/bench_pipelines.py --out "$OUT" --shapes ${HG_BENCH_ARGS:-} 2>&1 | grep -v "compil" | tee "$OUT/bench.log" | tail -n 120
fi
