# Session 21, call 8: per-tile statistics + MIN_FILL: GN + patch_diffusers GPU tier, A/B vs 3a22a1f, bench diffusion
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT
PYTHONPATH=/tmp/site:$PWD/src timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" $OUT/pytest_gn_patch.log | tail -8 | cut -c1-300
PYTHONPATH=$PWD/src timeout 200 python3 .gpu/s21_ab.py > $OUT/ab.log 2>&1; echo "ab rc=$?"
PYTHONPATH=/tmp/site:$PWD/src timeout 200 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out /tmp/dg > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; cp /tmp/dg/results.json $OUT/diffusion_results.json
grep -v Warn $OUT/ab.log | cut -c1-200
grep "group_norm" $OUT/bench_diffusion.log | cut -c1-130
