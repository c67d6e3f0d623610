# Session 33, call 3: GN GPU tier, A/B fwd+bwd old (ae4c7d2) vs new (channel sums in one launch), bench group_norm
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py -rf --tb=short 2>&1 | grep -v "Warn\|warn" | tail -8 > $OUT/gn_gpu_tests.log
tail -4 $OUT/gn_gpu_tests.log
for i in 1 2; do
  PYTHONPATH=$PWD/.gpu/old/src python3 .gpu/s33/gn_time.py old $OUT/old$i.json
  python3 .gpu/s33/gn_time.py new $OUT/new$i.json
done > $OUT/ab.log 2>&1
grep -v Warn $OUT/ab.log | tail -28
timeout 330 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out /tmp/dg > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; cp /tmp/dg/results.json $OUT/diffusion_results.json; cp /tmp/dg/*.png $OUT/ 2>/dev/null
grep "group_norm" $OUT/bench_diffusion.log | cut -c1-150
