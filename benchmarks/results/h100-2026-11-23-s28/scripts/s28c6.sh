# Session 28, call 6: loader chunk order in the NCHW forward and backward: A/B vs the session's start, GN GPU tier
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
timeout 240 python3 $S/s28_ab2.py > $OUT/ab2.log 2>&1; echo "ab rc=$?"
grep -v Warn $OUT/ab2.log | cut -c1-220 | tail -14
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn.log | tail -12 | cut -c1-300
