# GN GPU tier with the forward's two-round plans; the batch-2 levels' plans again (A/B vs forced plans); bench rows
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py tests/test_launch_cache.py 2>&1 | tail -4 | tee $OUT/gpu_tests.log
timeout 400 python3 -m flashfuse.cli bench diffusion --cuda-graph --rounds 3 --providers flashfuse,eager,compile --only "group_norm.* 2x" --no-progress --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep "group_norm" $OUT/bench.log | grep " 2x"
