# Session 20, call 3: statistics in a warp-per-channels layout on 128-byte-swizzled slots: GPU tests, probe, per-cb trace
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
git diff --stat HEAD | tail -1; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py -k "channels_last" > $OUT/pytest_cl.log 2>&1
echo "pytest cl rc=$?"; grep -E "passed|failed|FAILED|Error|error" $OUT/pytest_cl.log | head -20 | cut -c1-300
timeout 150 python3 .gpu/s20_cl_probe.py > $OUT/cl_probe.log 2>&1; echo "probe rc=$?"; cut -c1-150 $OUT/cl_probe.log | tail -12
timeout 120 python3 .gpu/s20_cl_trace.py > $OUT/cl_trace.log 2>&1; echo "trace rc=$?"; cut -c1-200 $OUT/cl_trace.log | tail -30
