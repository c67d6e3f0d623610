# Session 32, call 3: NCHW forward with held tiles, A/B vs committed; GN GPU tier
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 200 python3 .gpu/s32/s32_ab2.py > $OUT/ab2.log 2>&1; echo "ab rc=$?"
rm -f src/flashfuse/ops/group_norm_details/_fv_*.py
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn.log | tail -12 | cut -c1-300
grep -v Warn $OUT/ab2.log | cut -c1-200 | tail -16
