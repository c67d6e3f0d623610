# Session 13, call 8: GPU tier of group_norm at CHUNK_FIT_WAVE = True, the GroupNorm table (eager, compile, default,
# default-nofit) and the SD-1.5 loop vs torch.compile reduce-overhead.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_group_norm_gpu.log 2>&1
echo "pytest rc=$?"; tail -2 $OUT/pytest_group_norm_gpu.log
TUNE_BUDGET_S=200 timeout 260 python3 benchmarks/tune_group_norm.py --out $OUT/tune-gn --only "^(eager|compile|default|default-nofit) " > $OUT/tune_group_norm.log 2>&1
echo "tune rc=$?"
timeout 200 python3 -m flashfuse.cli bench models --only "sd15" --providers flashfuse-graph,hf-compile-graphs --no-progress --out $OUT/models-sd15 > $OUT/models_sd15.log 2>&1
echo "sd rc=$?"; grep -i "sd15\|ms" $OUT/models_sd15.log | tail -4
sed -n '/^variant /,$p' $OUT/tune_group_norm.log | awk '{printf "%-14s %-7s %-16s %-4s %8s %6s\n", $1, $2, $3, $4, $5, $7}'
