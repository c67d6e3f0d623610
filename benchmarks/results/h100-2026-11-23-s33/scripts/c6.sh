# Session 33, call 6: GN GPU tier and `flashfuse bench diffusion --only group_norm` at 79a398b
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py -rf --tb=short > $OUT/gn_gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED" $OUT/gn_gpu_tests.log | tail -5
timeout 330 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out /tmp/dg > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; cp /tmp/dg/results.json $OUT/diffusion_results.json; cp /tmp/dg/*.png $OUT/ 2>/dev/null
grep "group_norm" $OUT/bench_diffusion.log | cut -c1-150
