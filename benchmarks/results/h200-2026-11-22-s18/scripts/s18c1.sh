# Session 18, call 1: the Gluon GroupNorm forward: GPU tier of group_norm, probe vs the Triton plans and x.clone().
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py -k "hopper" > $OUT/pytest_hopper.log 2>&1
echo "pytest hopper rc=$?"; grep -E "passed|failed|FAILED|Error|error" $OUT/pytest_hopper.log | head -20 | cut -c1-300
timeout 200 python3 .gpu/s18_gn_probe.py > $OUT/gn_probe.log 2>&1
echo "probe rc=$?"; cut -c1-260 $OUT/gn_probe.log | tail -22
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest gn rc=$?"; grep -E "passed|failed|FAILED" $OUT/pytest_gn.log | head -20 | cut -c1-300
