export PYTHONPATH=$PWD/src
python3 -u .gpu/bwd_sweep_dq.py > $OUT/sweep_c7.log 2>&1; cat $OUT/sweep_c7.log
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py tests/test_ring_attention_gpu.py tests/test_hf_attention_gpu.py -k "not slow" > $OUT/tier_c7.log 2>&1
grep -v "Warning\|warner" $OUT/tier_c7.log | tail -6
