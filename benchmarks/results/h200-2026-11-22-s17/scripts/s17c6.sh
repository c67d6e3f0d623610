# Session 17, call 6: final table (two Q slots except hd128 causal; paired causal), GPU tiers (attention, launch
# cache, HF attention), host time, then `flashfuse bench attention`.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py tests/test_hf_attention_gpu.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest.log | head -20 | cut -c1-250
timeout 100 python3 .gpu/s17_host.py > $OUT/host.log 2>&1; echo "host rc=$?"; grep "round" $OUT/host.log
mkdir -p /tmp/b && timeout 330 python3 -m flashfuse.cli bench attention --no-progress --out /tmp/b/attention > $OUT/bench_attention.log 2>&1
echo "bench rc=$?"; tar czf $OUT/attention.tgz -C /tmp/b attention
grep -E "fwd hd" $OUT/bench_attention.log | cut -c1-175
