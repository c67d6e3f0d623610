# Session 17, call 8: the 2-GPU tests on the final code (ring attention, context parallel, distributed training / compile).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT; nvidia-smi -L
timeout 300 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider tests/test_ring_attention_gpu.py tests/test_context_parallel_gpu.py tests/test_distributed_training_gpu.py tests/test_distributed_compile_gpu.py > $OUT/pytest_2gpu.log 2>&1
echo "pytest 2gpu rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest_2gpu.log | head -30 | cut -c1-250
