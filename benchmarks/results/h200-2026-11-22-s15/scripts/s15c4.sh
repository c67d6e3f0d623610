# Session 15, call 4: the attention GPU tier on the final commit (option checks traceable with a symbolic head dim).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 400 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_custom_op.py > $OUT/pytest_flash_attn_final.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn_final.log | head -20 | cut -c1-250
