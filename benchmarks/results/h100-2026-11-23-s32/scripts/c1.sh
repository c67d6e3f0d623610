# Session 32, call 1: NCHW GroupNorm A/B (fwd loader wait always; bwd dz written back), GN GPU tier
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 300 python3 .gpu/s32/s32_ab.py > $OUT/ab.log 2>&1; echo "ab rc=$?"
rm -f src/flashfuse/ops/group_norm_details/_fv_*.py src/flashfuse/ops/group_norm_details/_bv_*.py
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn.log | tail -12 | cut -c1-300
grep -v Warn $OUT/ab.log | cut -c1-250 | tail -20
