# Session 16, call 6: the attention bench on the final code.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
mkdir -p /tmp/b && timeout 420 python3 -m flashfuse.cli bench attention --no-progress --out /tmp/b/attention > $OUT/bench_attention.log 2>&1
echo "bench rc=$?"; tar czf $OUT/attention.tgz -C /tmp/b attention
grep -E "bwd hd|fwd hd128 causal" $OUT/bench_attention.log | cut -c1-200
