# Session 16, call 8: the 2-GPU tests (ring attention and context parallelism call flash_attn_backward: the Gluon kernel).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT; nvidia-smi -L
timeout 500 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider tests/test_ring_attention_gpu.py tests/test_context_parallel_gpu.py tests/test_distributed_training_gpu.py > $OUT/pytest_2gpu.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_2gpu.log | head -30 | cut -c1-250
