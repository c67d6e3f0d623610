# Session 12, call 5: CHUNKED forward with the finalize folded into kernel 3: GPU tests, GroupNorm tune rows
# (default / chunked vs chunked-kernel2, same run).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest rc=$?"; tail -3 $OUT/pytest_gn.log
TUNE_BUDGET_S=300 timeout 380 python3 benchmarks/tune_group_norm.py --out $OUT/tune-gn --only "^(eager|compile|legacy|chunked|chunked-kernel2|default) " > $OUT/tune_group_norm.log 2>&1
echo "tune rc=$?"
sed -n '/^variant /,$p' $OUT/tune_group_norm.log | grep -v "^eager\|^compile" | awk '{printf "%-16s %-7s %-16s %-4s %8s %6s\n", $1, $2, $3, $4, $5, $7}'
