# Session 10, call 4: GPU tier of the changed code (GroupNorm second pass reversed, patch_diffusers layout / bias).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 --durations=8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py tests/test_patch_diffusers.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; tail -14 $OUT/pytest_gn_patch.log
