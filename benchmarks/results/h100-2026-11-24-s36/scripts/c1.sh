export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
timeout 280 python3 -m pytest -q -x -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py -k "not slow" tests/test_group_norm_gpu.py tests/test_launch_cache.py > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/gpu_tests.log
ROUNDS=3 timeout 280 python3 .gpu/s36/ab.py fwd > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep -v "^r[0-9]\|Warn" $OUT/ab.log | tail -16; grep -c DIFFERS $OUT/ab.log
