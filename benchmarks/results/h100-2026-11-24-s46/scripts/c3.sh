export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py -k "padded or odd_causal_tails" > $OUT/tests_c3.log 2>&1
tail -4 $OUT/tests_c3.log
python3 -m flashfuse.cli bench attention --only "hd(80|96|256) " --rounds 3 --out $OUT/bench --no-progress > $OUT/bench_c3.log 2>&1
tail -42 $OUT/bench_c3.log | cut -c1-140
