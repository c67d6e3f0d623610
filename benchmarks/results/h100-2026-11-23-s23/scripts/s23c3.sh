# Session 23, call 3: 64-key tiles with the lower warpgroup's unread release (hd64 causal), batch-1 plans, GPU tests.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 .gpu/s23_bn64.py > $OUT/bn64.log 2>&1; echo "bn64 rc=$?"
timeout 330 python3 -m pytest -q -x -p no:cacheprovider tests/test_flash_attn_gpu.py -k "hopper" > $OUT/tests.log 2>&1; echo "tests rc=$?"
tail -3 $OUT/tests.log; grep -E "FAIL|Error" $OUT/tests.log | head -10
SMALL_QUICK=1 timeout 90 python3 .gpu/s23_small.py > $OUT/small.log 2>&1; echo "small rc=$?"
grep -v Warn $OUT/bn64.log; grep -v Warn $OUT/small.log | cut -c1-200
