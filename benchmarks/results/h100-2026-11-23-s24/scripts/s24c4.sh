# Session 24, call 4: NCHW Gluon forward with split groups: GN GPU tests (hopper), A/B vs before / Triton
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT
PYTHONPATH=$PWD/src timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py -k "hopper or sd_shapes" > $OUT/pytest_hopper.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_hopper.log | tail -12 | cut -c1-300
PYTHONPATH=$PWD/src timeout 200 python3 .gpu/s24_fwd_ab.py > $OUT/fwd_ab.log 2>&1; echo "ab rc=$?"
grep -v Warn $OUT/fwd_ab.log | cut -c1-250 | tail -16
