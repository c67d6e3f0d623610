# Session 22, call 1: hd64 backward in the row layout (128-row steps): GPU tests of the Gluon backward, then the probe.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py -k "hopper_backward" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | head -20 | cut -c1-250
timeout 300 python3 .gpu/s22_bwd.py 2>&1 | tee $OUT/bwd.log | grep -v Warning
