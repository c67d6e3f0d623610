# Session 10, call 2: patch_diffusers layout fix (channels_last through Transformer2DModel), no /1.0 kernels;
# SD-1.5 kernel profile (patched); the SD loop vs torch.compile reduce-overhead; GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
PROF_RUNS=1 timeout 90 python3 .gpu/s10_prof_sd.py > $OUT/prof_sd15.log 2>&1
echo "prof rc=$?"; grep -E "=====|^  [a-z]" $OUT/prof_sd15.log | head -4; grep "other\]" $OUT/prof_sd15.log | head -8
timeout 330 python3 -m flashfuse.cli bench models --only "sd15" --providers flashfuse-graph,hf-compile-graphs --no-progress --out $OUT/models-sd15 > $OUT/models_sd15.log 2>&1
echo "bench rc=$?"; tail -6 $OUT/models_sd15.log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; tail -3 $OUT/pytest_gn_patch.log
