# Session 13, call 7: CHUNKED's grid rounded to one wave (CHUNK_FIT_WAVE) and programs per SM, fwd and fwd+bwd.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
TUNE_BUDGET_S=330 timeout 420 python3 benchmarks/tune_group_norm.py --out $OUT/tune-gn --only "^(default|default-fit|default-pps8|default-fit-pps8|default-fit-pps12) " > $OUT/tune_group_norm_fit.log 2>&1
echo "tune rc=$?"
sed -n '/^variant /,$p' $OUT/tune_group_norm_fit.log | awk '{printf "%-18s %-7s %-16s %-4s %8s %6s\n", $1, $2, $3, $4, $5, $7}'
