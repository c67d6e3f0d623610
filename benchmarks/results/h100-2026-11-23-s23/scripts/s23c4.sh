# Session 23, call 4: GPU tier of the attention (launch plans, thresholds, 64-key causal tiles) and the LaunchCache users.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 540 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py \
  tests/test_hf_attention_gpu.py tests/test_group_norm_gpu.py tests/test_cuda_graph_gpu.py tests/test_progression.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | head -20 | cut -c1-250
