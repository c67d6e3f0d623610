# Session 16, call 1: the Gluon backward - a quick correctness/timing pass, then the attention GPU tier.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
SEQLENS=1024,4096,8192 timeout 150 python3 .gpu/s16_bwd.py > $OUT/bwd.log 2>&1; echo "bwd rc=$?"
tail -40 $OUT/bwd.log | cut -c1-250
timeout 240 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py > $OUT/pytest_flash_attn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn.log | head -30 | cut -c1-250
