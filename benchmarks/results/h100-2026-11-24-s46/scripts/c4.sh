export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -x tests/test_flash_attn_kernels_gpu.py -k "padded or odd_causal_tails" > $OUT/tests_c4a.log 2>&1
tail -4 $OUT/tests_c4a.log
python3 -u .gpu/bwd_sweep46.py > $OUT/sweep_c4.log 2>&1
cat $OUT/sweep_c4.log
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py tests/test_ring_attention_gpu.py tests/test_hf_attention_gpu.py -k "not slow" > $OUT/tests_c4.log 2>&1
tail -6 $OUT/tests_c4.log
