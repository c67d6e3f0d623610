# Session 28, call 7: two tiles per pass-3 iteration (A/B); flashfuse bench diffusion --only group_norm at the commit
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
timeout 150 python3 $S/s28_ab3.py > $OUT/ab3.log 2>&1; echo "ab3 rc=$?"
grep -v Warn $OUT/ab3.log | cut -c1-200 | tail -10
rm -f src/flashfuse/ops/group_norm_details/_fv_*.py
timeout 300 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out /tmp/dg > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; cp /tmp/dg/results.json $OUT/diffusion_results.json; cp /tmp/dg/*.png $OUT/ 2>/dev/null
grep "group_norm_silu" $OUT/bench_diffusion.log | cut -c1-130
