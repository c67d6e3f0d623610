# Session 16, call 12: review fixes (explicit barrier in the Gluon backward, dtype check, HF deterministic) - GPU tiers.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_hf_attention_gpu.py tests/test_patch_transformers_gpu.py > $OUT/pytest_gpu.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_gpu.log | head -20 | cut -c1-250
SEQLENS=2048,8192 HDS=128 timeout 60 python3 .gpu/s16_bwd.py > $OUT/bwd.log 2>&1; echo "bwd rc=$?"; tail -4 $OUT/bwd.log | cut -c1-200
