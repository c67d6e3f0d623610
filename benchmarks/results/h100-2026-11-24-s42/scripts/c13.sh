# final GroupNorm plans: GN GPU tier; old vs new plans where the forward's changed; the GroupNorm + SiLU bench rows
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py tests/test_launch_cache.py 2>&1 | tail -3 | tee $OUT/gpu_tests.log
timeout 150 python3 -u .gpu/gn_plan_check.py > $OUT/gn_plan_check.log 2>&1; echo rc=$?
grep -v Warn $OUT/gn_plan_check.log
timeout 330 python3 -m flashfuse.cli bench diffusion --cuda-graph --rounds 3 --providers flashfuse,eager,compile --only "group_norm_silu" --no-progress --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep "rows" $OUT/bench.log | tail -1
