python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py tests/test_hf_attention_gpu.py tests/test_patch_diffusers_gpu.py -k "not slow" > $OUT/tests_c4.log 2>&1
tail -6 $OUT/tests_c4.log
python3 -m flashfuse.cli bench models --only "dit-xl-2" --providers flashfuse-graph,hf-eager,hf-compile-graphs --rounds 3 --out $OUT/bench_models --no-progress --no-plots > $OUT/bench_models.log 2>&1
tail -25 $OUT/bench_models.log
