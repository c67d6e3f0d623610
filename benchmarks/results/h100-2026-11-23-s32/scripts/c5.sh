# Session 32, call 5: GN GPU tier at the committed code (bwd dz written back; the new ring-sized forward case)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
git log --oneline | head -1
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn.log | tail -12 | cut -c1-300
