# Session 24, call 5 (final code): GN + patch_diffusers GPU tier, A/B, bench diffusion
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT
PYTHONPATH=/tmp/site:$PWD/src timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gn_patch.log | tail -12 | cut -c1-300
PYTHONPATH=$PWD/src timeout 200 python3 .gpu/s24_fwd_ab.py > $OUT/fwd_ab.log 2>&1; echo "ab rc=$?"
PYTHONPATH=/tmp/site:$PWD/src timeout 200 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out /tmp/dg > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; cp /tmp/dg/results.json $OUT/diffusion_results.json; cp /tmp/dg/*.png $OUT/ 2>/dev/null
grep -v Warn $OUT/fwd_ab.log | cut -c1-250 | tail -14
grep "group_norm" $OUT/bench_diffusion.log | cut -c1-150
