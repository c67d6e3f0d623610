# Session 16, call 7: the rest of the GPU tier on the final code (flash attention's ran in call 5).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 560 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests --ignore=tests/test_flash_attn_gpu.py > $OUT/pytest_gpu.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_gpu.log | head -30 | cut -c1-250
