# Session 28, call 9: the next tile taken during this tile's exponentials: A/B vs 2b7a2b7, GN GPU tier
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
timeout 150 python3 $S/s28_ab4.py > $OUT/ab4.log 2>&1; echo "ab4 rc=$?"
grep -v Warn $OUT/ab4.log | cut -c1-200 | tail -10
rm -f src/flashfuse/ops/group_norm_details/_fv_*.py
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn.log | tail -12 | cut -c1-300
