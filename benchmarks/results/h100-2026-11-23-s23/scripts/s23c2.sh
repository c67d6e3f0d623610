# Session 23, call 2: host time per call and the short-S bench rows, HEAD (.gpu/base) vs the working tree, same machine.
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
for t in base new; do
  src=$PWD/src; [ $t = base ] && src=$PWD/.gpu/base/src
  PYTHONPATH=$src timeout 80 python3 .gpu/s23_host.py $t > $OUT/host_$t.log 2>&1; echo "host $t rc=$?"
done
for t in base new base new; do
  src=$PWD/src; [ $t = base ] && src=$PWD/.gpu/base/src
  PYTHONPATH=$src timeout 140 python3 -m flashfuse.cli bench attention --no-progress --no-plots --only "S=(512|1024) bf16" \
    --providers flashfuse,sdpa-cudnn,sdpa-flash --out /tmp/b_$t >> $OUT/bench_$t.log 2>&1; echo "bench $t rc=$?"
done
grep "round 1" $OUT/host_*.log
for t in base new; do echo "== $t"; grep -E "^│ (fwd|bwd)" $OUT/bench_$t.log; done
