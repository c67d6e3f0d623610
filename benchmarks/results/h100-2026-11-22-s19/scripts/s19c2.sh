# Session 19, call 2: the channels_last Gluon forward: its GPU tests (timeout: a meeting that never completes would
# hang), the probe vs the Triton plans, then the whole GN GPU tier.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT
timeout 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py -k "channels_last" > $OUT/pytest_cl.log 2>&1
echo "pytest cl rc=$?"; grep -E "passed|failed|FAILED|Error|error" $OUT/pytest_cl.log | head -20 | cut -c1-300
timeout 120 python3 .gpu/s19_cl_probe.py > $OUT/cl_probe.log 2>&1; echo "probe rc=$?"; cut -c1-200 $OUT/cl_probe.log | tail -12
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest gn rc=$?"; tail -1 $OUT/pytest_gn.log | cut -c1-300
