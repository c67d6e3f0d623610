# Session 34, call 3: persistent hd64 backward (tiles in turn per program, K/V of the next tile loaded while dK/dV
# leave): Gluon backward GPU tests (hd64 persistent, hd128 through the tile loop), then A/B vs the committed kernel.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py -k "hopper_backward" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | head -20 | cut -c1-250
timeout 330 python3 .gpu/s34/bwd_ab.py 2>&1 | tee $OUT/bwd_ab.log | grep -v Warning
