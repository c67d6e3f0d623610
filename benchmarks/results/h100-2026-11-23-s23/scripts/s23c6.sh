# Session 23, call 6: GPU tests of the Gluon attention after SKIP_UNSEEN; hd64 causal bench rows.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py -k "hopper or backward or launch or repeated" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | head -10 | cut -c1-250
timeout 200 python3 -m flashfuse.cli bench attention --no-progress --no-plots --only "fwd hd64 causal" --out /tmp/b6 > $OUT/bench_hd64_causal.log 2>&1
echo "bench rc=$?"; grep -E "^│ fwd" $OUT/bench_hd64_causal.log
