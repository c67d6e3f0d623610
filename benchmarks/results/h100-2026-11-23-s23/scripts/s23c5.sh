# Session 23, call 5: the fixed LaunchCache test; `flashfuse bench attention` (eager calls) at the session's code.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider tests/test_launch_cache.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | head -5 | cut -c1-250
mkdir -p /tmp/b && timeout 480 python3 -m flashfuse.cli bench attention --no-progress --out /tmp/b/attention > $OUT/bench_attention.log 2>&1
echo "bench rc=$?"; tar czf $OUT/attention.tgz -C /tmp/b attention
grep -E "^│ (fwd|bwd|progression|long)" $OUT/bench_attention.log
