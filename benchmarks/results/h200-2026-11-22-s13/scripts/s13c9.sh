# Session 13, call 9: GPU tier of group_norm at CHUNK_FIT_WAVE = True (call 8's run hit its 240 s limit cold).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_group_norm_gpu.log 2>&1
echo "pytest rc=$?"; tail -3 $OUT/pytest_group_norm_gpu.log
