# Session 15, call 10: the final commit - GroupNorm GPU tier (RESIDENT removed) and the Gluon attention tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 400 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_flash_attn_gpu.py > $OUT/pytest_final.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_final.log | head -20 | cut -c1-250
