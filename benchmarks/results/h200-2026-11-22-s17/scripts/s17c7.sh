# Session 17, call 7: the whole one-GPU tier on the final code (2-GPU tests skip here).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 540 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests > $OUT/pytest_gpu.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gpu.log | head -30 | cut -c1-250
