export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py tests/test_ring_attention_gpu.py tests/test_hf_attention_gpu.py -k "not slow" > $OUT/tier_c3.log 2>&1
grep -v "Warning\|warner" $OUT/tier_c3.log | tail -4
python3 -m flashfuse.cli bench attention --only "hd(160|192) " --rounds 3 --out $OUT/bench --no-progress > $OUT/bench_c3.log 2>&1
tail -30 $OUT/bench_c3.log
