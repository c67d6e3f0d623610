# Session 15, call 5: the warp-specialized forward with host-side 4-D TMA descriptors (no per-tile descriptor
# creation): sweep vs the shipped path (now this kernel) and cuDNN, then the attention GPU tier.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 300 python3 .gpu/s15_ws.py 2>&1 | tee $OUT/s15_ws.log | grep -v Warning
timeout 250 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py > $OUT/pytest_flash_attn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_flash_attn.log | head -20 | cut -c1-250
