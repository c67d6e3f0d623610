export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_window_gpu.py tests/test_flash_attn_gpu.py -k "not slow" 2>&1 | tail -2 | tee $OUT/fa_gpu.log
