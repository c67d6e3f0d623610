# Session 21, call 9: the GN + patch_diffusers GPU tier at the final commit (call 8's run hit its 240 s timeout
# after its 84 dots: the larger channels_last cases' float64 references take longer)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT; git diff --stat HEAD -- src tests | tail -1
PYTHONPATH=/tmp/site:$PWD/src timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 --durations=8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|s call" $OUT/pytest_gn_patch.log | tail -14 | cut -c1-200
