# Session 18, call 2: Gluon GroupNorm forward variants (16 compute warps, one-pass statistics); hopper GPU tests.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py -k "hopper" > $OUT/pytest_hopper.log 2>&1
echo "pytest hopper rc=$?"; grep -E "passed|failed|FAILED|Error|error" $OUT/pytest_hopper.log | head -20 | cut -c1-300
timeout 200 python3 .gpu/s18_gn_probe2.py > $OUT/gn_probe2.log 2>&1
echo "probe rc=$?"; cut -c1-330 $OUT/gn_probe2.log | tail -12
