export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py -k "softcap or alibi" > $OUT/tests_c3.log 2>&1
tail -15 $OUT/tests_c3.log
MOD=alibi DIMS=128,64 SEQS=4096 ROUNDS=2 timeout 300 python3 -u .gpu/softcap_time48.py > $OUT/time_c3.log 2>&1
cat $OUT/time_c3.log | grep -v Warning
python3 -m flashfuse.cli bench attention --only alibi --rounds 3 --out $OUT/bench_alibi --no-progress > $OUT/bench_c3.log 2>&1
tail -12 $OUT/bench_c3.log
