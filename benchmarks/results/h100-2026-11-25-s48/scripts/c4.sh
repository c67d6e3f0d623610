export PYTHONPATH=$PWD/src
MOD=alibi DIMS=128,64 SEQS=4096 ROUNDS=2 timeout 240 python3 -u .gpu/softcap_time48.py 2>&1 | grep -v "Warning\|warn\|flex failed" > $OUT/time_c4.log
cat $OUT/time_c4.log
python3 -m flashfuse.cli bench attention --only alibi --rounds 3 --out $OUT/bench_alibi --no-progress > $OUT/bench_c4.log 2>&1
tail -12 $OUT/bench_c4.log
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py tests/test_ring_attention_gpu.py tests/test_hf_attention_gpu.py tests/test_patch_transformers_gpu.py -k "not slow" > $OUT/tests_c4.log 2>&1
tail -8 $OUT/tests_c4.log
