set -x
export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py tests/test_launch_cache.py 2>&1 | tail -5 | tee $OUT/gpu_tests.log
python .gpu/ab_new.py 2>&1 | grep -v Warning | tee $OUT/ab_new.log
rm -f src/flashfuse/ops/group_norm_details/_old_*.py
python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out $OUT/bench > $OUT/bench.log 2>&1; tail -40 $OUT/bench.log
