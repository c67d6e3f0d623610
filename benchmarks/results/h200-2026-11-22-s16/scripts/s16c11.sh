# Session 16, call 11: final code (hd64 three-consumer forward, backward 1-D grid) - attention GPU tier, then the bench.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 150 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py > $OUT/pytest_flash_attn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn.log | head -20 | cut -c1-250
mkdir -p /tmp/b && timeout 400 python3 -m flashfuse.cli bench attention --no-progress --out /tmp/b/attention > $OUT/bench_attention.log 2>&1
echo "bench rc=$?"; tar czf $OUT/attention.tgz -C /tmp/b attention
grep -E "hd64 full|bwd hd128" $OUT/bench_attention.log | cut -c1-175
