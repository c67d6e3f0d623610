#!/usr/bin/env bash
# One call on the GPU machine (device tool): install, optionally run the GPU test tier, then benchmark.
#   bash benchmarks/gpu_run.sh [--tests] SUITE...      results land in $OUT (bench.tgz, logs)
# The GPU image has torch and triton but no registry: install without dependencies.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/flashfuse-out}
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
flashfuse info | tee "$out/info.txt"
if [ "${1:-}" = "--tests" ]; then
    shift
    timeout 330 python3 -m pytest -m gpu -q -rf --durations=10 2>&1 | tee "$out/pytest_gpu.log" | tail -40
fi
for suite in "$@"; do
    flashfuse bench "$suite" --out "bench/$suite" 2>&1 | tee "$out/bench_$suite.log" | tail -60
done
[ "$#" -gt 0 ] && tar czf "$out/bench.tgz" bench
exit 0
