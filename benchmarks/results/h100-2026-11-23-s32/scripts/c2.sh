# Session 32, call 2: channels_last Gluon forward at C = 1280 with one big chunk (A/B vs Triton plans);
# flashfuse bench diffusion --only group_norm at 4d90a2a (bwd dz written back)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 200 python3 .gpu/s32/s32_cl1280.py > $OUT/cl1280.log 2>&1; echo "cl1280 rc=$?"
grep -v Warn $OUT/cl1280.log | cut -c1-260 | tail -12
timeout 330 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out /tmp/dg > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; cp /tmp/dg/results.json $OUT/diffusion_results.json; cp /tmp/dg/*.png $OUT/ 2>/dev/null
grep "group_norm" $OUT/bench_diffusion.log | cut -c1-150
