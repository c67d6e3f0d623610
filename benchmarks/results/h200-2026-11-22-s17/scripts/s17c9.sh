# Session 17, call 9: review fixes (odd row-block plan, LaunchCache robustness): attention GPU tier + launch cache tests.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 240 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest.log | head -20 | cut -c1-250
