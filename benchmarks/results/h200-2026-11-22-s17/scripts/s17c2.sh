# Session 17, call 2: the forward's key loop split at the first masked block; variants (2 / 3 consumers, paired /
# one tile), attention GPU tier.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 300 python3 .gpu/s17_fwd2.py > $OUT/fwd2.log 2>&1; echo "probe rc=$?"
timeout 200 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py > $OUT/pytest_flash_attn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn.log | head -20 | cut -c1-250
cat $OUT/fwd2.log | cut -c1-250
