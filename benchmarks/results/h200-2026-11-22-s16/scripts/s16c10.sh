# Session 16, call 10: the hd64 Gluon forward with three consumer warpgroups; the backward's 1-D grid (GPU tier).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 python3 .gpu/s16_fwd3.py > $OUT/fwd3.log 2>&1; echo "fwd3 rc=$?"
tail -12 $OUT/fwd3.log | cut -c1-250
timeout 150 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py > $OUT/pytest_flash_attn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn.log | head -20 | cut -c1-250
