# Session 22, call 7: the Gluon backward's GPU tests at the final commit (comments / line wraps since call 4's 188 passed).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT
timeout 240 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py -k "hopper or backward" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | head -20 | cut -c1-250
