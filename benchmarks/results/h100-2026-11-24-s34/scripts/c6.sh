# Session 34, call 6: flashfuse bench diffusion --cuda-graph --only group_norm (flashfuse / eager / compile, same run)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 560 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out $OUT/bench > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; grep -v -i warn $OUT/bench_diffusion.log | grep -E "group_norm|ceiling|rows" | cut -c1-140
cp $OUT/bench/*.json $OUT/bench/*.png $OUT/ 2>/dev/null; rm -rf $OUT/bench
