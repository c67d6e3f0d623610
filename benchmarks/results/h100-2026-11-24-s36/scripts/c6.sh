export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py tests/test_flash_bwd_paths.py -k "not slow" > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests.log | head -30
for S in 2048 1024; do S=$S timeout 200 python3 .gpu/s36/dims.py 2>&1 | grep -v Warn | tee $OUT/dims_$S.log | tail -14; done
