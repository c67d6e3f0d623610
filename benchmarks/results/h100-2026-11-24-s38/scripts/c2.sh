export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py tests/test_flash_attn_window_gpu.py -k "not slow" 2>&1 | grep -v "Warning\|warner" | tail -15
TAG=c2 python3 .gpu/wide.py 2>&1 | tee $OUT/wide_c2.log
