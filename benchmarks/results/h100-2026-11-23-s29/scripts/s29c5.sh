# Session 29, call 5: GPU tier of the attention forward / backward at c09cdf8's table (+ O_DIRECT off by default); O_DIRECT A/B
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s29/scripts
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py > $OUT/tier.log 2>&1
echo "tier rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/tier.log | tail -8 | cut -c1-300
timeout 240 python3 $S/s29_direct.py > $OUT/s29_direct.log 2>&1; echo "direct rc=$?"
grep -v Warn $OUT/s29_direct.log | tail -9
