# Session 23, call 1: the hd64 causal forward's per-tile trace at short S; small-grid attention forwards.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 .gpu/s23_trace.py > $OUT/trace.log 2>&1; echo "trace rc=$?"
timeout 240 python3 .gpu/s23_small.py > $OUT/small.log 2>&1; echo "small rc=$?"
cat $OUT/trace.log | grep -v Warning | tail -60; cat $OUT/small.log | grep -v Warning | tail -30
