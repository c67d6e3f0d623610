# Session 22, call 3: GPU tier of attention (hd64 backward in the row layout), then the hd64 forward K/V-stage probe.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT
timeout 240 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py tests/test_hf_attention_gpu.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" $OUT/pytest.log | head -20 | cut -c1-250
timeout 200 python3 .gpu/s22_fwd_stages.py 2>&1 | tee $OUT/fwd_stages.log | grep -v Warn
