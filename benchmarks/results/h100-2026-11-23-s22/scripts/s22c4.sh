# Session 22, call 4: `flashfuse bench attention` (hd64 backward in the row layout), host time per call.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/b && timeout 420 python3 -m flashfuse.cli bench attention --no-progress --out /tmp/b/attention > $OUT/bench_attention.log 2>&1
echo "bench rc=$?"; tar czf $OUT/attention.tgz -C /tmp/b attention
grep -E "hd64|hd128" $OUT/bench_attention.log | cut -c1-175
timeout 100 python3 .gpu/s17_host.py > $OUT/host.log 2>&1; echo "host rc=$?"; grep "round" $OUT/host.log
