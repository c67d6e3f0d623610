# Session 18, call 6: final GroupNorm Gluon forward: GPU tier (group_norm, patch_diffusers), the GroupNorm table
# (eager, compile, default-triton, default) and flashfuse bench diffusion (CUDA graphs).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; tail -2 $OUT/pytest_gn_patch.log | cut -c1-300
TUNE_BUDGET_S=200 timeout 280 python3 benchmarks/tune_group_norm.py --out $OUT/tune-gn --only "^(eager|compile|default-triton|default) " > $OUT/tune_group_norm.log 2>&1
echo "tune rc=$?"
timeout 200 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out $OUT/diffusion-graph > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"; tail -25 $OUT/bench_diffusion.log | cut -c1-200
sed -n '/^variant /,$p' $OUT/tune_group_norm.log | awk '{printf "%-14s %-7s %-16s %-4s %8s %6s\n", $1, $2, $3, $4, $5, $7}'
