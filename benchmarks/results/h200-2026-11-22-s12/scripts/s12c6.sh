# Session 12, call 6: channels_last routing (small tensors per-group), GPU tests of group_norm.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 150 python3 .gpu/s12_route_probe.py > $OUT/route_probe.log 2>&1
echo "probe rc=$?"; cat $OUT/route_probe.log | tail -10
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; tail -3 $OUT/pytest_gn.log
