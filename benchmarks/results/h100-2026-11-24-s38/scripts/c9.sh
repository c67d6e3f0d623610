export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py -k "not slow" 2>&1 | grep -v "Warning\|warner" | tail -4
DIMS=160,256 SEQS=2048,4096 NAMES=gluon,cudnn TAG=c9 python3 .gpu/wide.py 2>&1 | tee $OUT/wide_c9.log
