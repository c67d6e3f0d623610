# Session 34, call 2: hd64 backward with the next step's S issued ahead: Gluon backward GPU tests, then the A/B.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py -k "hopper_backward" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | head -20 | cut -c1-250
BRANCH=1 timeout 330 python3 .gpu/s34/bwd_ab.py 2>&1 | tee $OUT/bwd_ab.log | grep -v Warning
