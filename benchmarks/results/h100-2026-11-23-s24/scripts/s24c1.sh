# Session 24, call 1: the NCHW Gluon GroupNorm backward: its GPU tests, GN GPU tier, probe vs Triton, bench diffusion
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT
PYTHONPATH=/tmp/site:$PWD/src timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py -k "hopper_backward or sd_shapes" > $OUT/pytest_bwd.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_bwd.log | tail -12 | cut -c1-300
PYTHONPATH=$PWD/src timeout 150 python3 .gpu/s24_bwd_probe.py > $OUT/bwd_probe.log 2>&1; echo "probe rc=$?"
grep -v Warn $OUT/bwd_probe.log | cut -c1-250 | tail -30
