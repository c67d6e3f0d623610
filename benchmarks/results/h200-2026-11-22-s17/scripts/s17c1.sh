# Session 17, call 1: paired persistent causal forward (probe vs one tile vs Triton, graph-timed), attention GPU tier.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 240 python3 .gpu/s17_causal.py > $OUT/causal.log 2>&1; echo "probe rc=$?"
timeout 200 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py > $OUT/pytest_flash_attn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn.log | head -20 | cut -c1-250
cat $OUT/causal.log | cut -c1-250
