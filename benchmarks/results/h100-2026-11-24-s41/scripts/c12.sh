export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_wide_gpu.py -k "not slow" 2>&1 | grep -v "Warning\|warner" | grep -E "passed|failed|FAILED|Error" | tail -15 | tee $OUT/gpu_tests.log
