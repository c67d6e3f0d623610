#!/usr/bin/env bash
# One call on the GPU machine (device tool): install, optionally run the GPU test tier, then benchmark.
#   bash benchmarks/gpu_run.sh [--tests [PYTEST_ARGS...] --] SUITE...   results land in $OUT (bench.tgz, logs)
#   BENCH_ARGS="--quick" bash benchmarks/gpu_run.sh llm                 extra `flashfuse bench` options
# The GPU image has torch, triton and transformers but no registry: pure-Python wheels it lacks
# (liger-kernel for the peers) travel in .whl/ (carry it) and go to /tmp/site; the project installs
# without dependencies.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/flashfuse-out}
mkdir -p "$out"
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl 2>&1 | tail -2
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
flashfuse info | tee "$out/info.txt"
if [ "${1:-}" = "--tests" ]; then
    shift
    args=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -m gpu -q -rf --durations=15 "${args[@]}" 2>&1 \
        | tee "$out/pytest_gpu.log" | tail -60
fi
for suite in "$@"; do
    flashfuse bench "$suite" --out "bench/$suite" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench_$suite.log" | tail -60
done
[ "$#" -gt 0 ] && tar czf "$out/bench.tgz" bench
exit 0
