export PYTHONPATH=$PWD/src
python3 -m flashfuse.cli bench attention --only softcap --rounds 3 --out $OUT/bench_softcap --no-progress > $OUT/bench_c2.log 2>&1
tail -30 $OUT/bench_c2.log
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py tests/test_ring_attention_gpu.py tests/test_hf_attention_gpu.py -k "not slow" > $OUT/tests_c2.log 2>&1
tail -8 $OUT/tests_c2.log
