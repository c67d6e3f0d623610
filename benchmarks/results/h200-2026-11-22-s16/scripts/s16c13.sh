# Session 16, call 13: the tidy commit (shared launcher helpers) - attention GPU tier.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py > $OUT/pytest_flash_attn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn.log | head -20 | cut -c1-250
