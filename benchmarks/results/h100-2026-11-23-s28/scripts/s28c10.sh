# Session 28, call 10: each group's rows split between two 4-warp partitions (HALVES = 2): A/B, GN GPU tier
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
timeout 200 python3 $S/s28_ab5.py > $OUT/ab5.log 2>&1; echo "ab5 rc=$?"
grep -v Warn $OUT/ab5.log | cut -c1-230 | tail -12
rm -f src/flashfuse/ops/group_norm_details/_fv_*.py
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 -x tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn.log | tail -12 | cut -c1-300
