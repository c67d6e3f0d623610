# Session 10, call 1: GroupNorm second pass backwards (+ evict_first variants); SD-1.5 UNet kernel profile.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
TUNE_BUDGET_S=190 timeout 260 python3 benchmarks/tune_group_norm.py --out $OUT/tune-gn > $OUT/tune_group_norm.log 2>&1
echo "tune rc=$?"
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_group_norm.log 2>&1
echo "pytest rc=$?"; tail -2 $OUT/pytest_group_norm.log
timeout 200 python3 .gpu/s10_prof_sd.py > $OUT/prof_sd15.log 2>&1
echo "prof rc=$?"
grep -E "=====|^  [a-z]" $OUT/prof_sd15.log | head -20
sed -n '/^variant /,$p' $OUT/tune_group_norm.log | grep -v "^compile\|chunked-waves\|chunked-st2\|chunked-pps" | awk '{printf "%-18s %-7s %-16s %-4s %8s %6s %6s\n", $1, $2, $3, $4, $5, $7, $8}'
