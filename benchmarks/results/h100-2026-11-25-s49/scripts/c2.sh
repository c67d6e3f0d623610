export PYTHONPATH=$PWD/src
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_wide_gpu.py -k "deterministic or varlen_gluon_forward" > $OUT/tests_c2.log 2>&1
echo "tests rc=$?"
tail -15 $OUT/tests_c2.log
timeout 240 python3 -u benchmarks/results/h100-2026-11-25-s49/scripts/det_time49.py > $OUT/time_c2.log 2>&1
echo "time rc=$?"
cat $OUT/time_c2.log | tail -20
