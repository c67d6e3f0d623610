# Session 29, call 1: HALF_LAST (GPU tests of the Gluon forward, new configs included) and causal configs beside cuDNN
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s29/scripts
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -x tests/test_flash_attn_gpu.py -k "hopper_forward" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/tests.log
timeout 300 python3 $S/s29_fwd.py 2 > $OUT/s29_fwd.log 2>&1; echo "fwd rc=$?"
grep -v Warn $OUT/s29_fwd.log | tail -8
