export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py 2>&1 | grep -v "Warning\|warner" | grep -E "passed|failed|FAILED|Error" | tail -15 | tee $OUT/gpu_tests.log
