export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
python3 -u benchmarks/results/h100-2026-11-25-s49/scripts/det_time49.py > $OUT/time_c1.log 2>&1
cat $OUT/time_c1.log | tail -20
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_wide_gpu.py -k "deterministic" > $OUT/tests_c1.log 2>&1
tail -15 $OUT/tests_c1.log
python3 -m flashfuse.cli bench attention --only deterministic --rounds 3 --out $OUT/bench_det --no-progress > $OUT/bench_c1.log 2>&1
tail -20 $OUT/bench_c1.log
