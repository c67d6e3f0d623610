export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py -k "not slow" > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests.log | head -30
S=2048 timeout 200 python3 .gpu/s36/dims.py 2>&1 | grep -v Warn | tee $OUT/dims_2048.log | tail -16
