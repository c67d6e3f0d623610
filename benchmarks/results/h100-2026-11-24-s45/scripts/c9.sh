export PYTHONPATH=$PWD/src
DIMS=256 python3 -u .gpu/bwd_sweep_dq.py > $OUT/sweep_c9.log 2>&1; cat $OUT/sweep_c9.log
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_window_gpu.py -k "not slow" > $OUT/tier_c9.log 2>&1
grep -v "Warning\|warner" $OUT/tier_c9.log | tail -5
