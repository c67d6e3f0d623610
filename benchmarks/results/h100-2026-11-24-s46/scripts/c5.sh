export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py -k "d72 or d80 or d96 or padded or odd_causal_tails" > $OUT/tests_c5.log 2>&1
tail -4 $OUT/tests_c5.log
python3 -m flashfuse.cli bench attention --only "hd(80|96) " --rounds 3 --out $OUT/bench --no-progress > $OUT/bench_c5.log 2>&1
tail -30 $OUT/bench_c5.log | cut -c1-140
