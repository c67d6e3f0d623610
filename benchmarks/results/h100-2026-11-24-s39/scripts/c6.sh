export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py 2>&1 | grep -v "Warning\|warner" | tail -4 | tee $OUT/gpu_tests.log
