# Session 12, call 7: GPU tests of group_norm (channels_last routing); SD-1.5 30-step loop vs compile.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; tail -3 $OUT/pytest_gn.log
timeout 330 python3 -m flashfuse.cli bench models --only "sd15" --providers flashfuse-graph,hf-compile-graphs --no-progress --out $OUT/models-sd15 > $OUT/models_sd15.log 2>&1
echo "bench rc=$?"; tail -8 $OUT/models_sd15.log
