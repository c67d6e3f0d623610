# Session 28, call 4: the forward's loader order and shared last chunk: GN GPU tier, A/B vs the session's start
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
timeout 150 python3 $S/s28_ab.py > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep -v Warn $OUT/ab.log | cut -c1-200 | tail -16
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn.log | tail -12 | cut -c1-300
