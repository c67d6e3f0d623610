# Session 30, call 1: GPU tier of the attention tests with SPLIT_PV_WAIT on, then the A/B vs the previous schedule
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s30/scripts
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py -x > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/tests.log
timeout 280 python3 $S/s30_ab.py > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep -v "^round\|Warn" $OUT/ab.log | tail -24
