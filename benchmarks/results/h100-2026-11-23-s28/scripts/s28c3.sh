# Session 28, call 3: chunks of at most T tiles per program (K-way split groups) in the NCHW forward
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
timeout 200 python3 $S/s28_ksplit.py > $OUT/ksplit.log 2>&1; echo "ksplit rc=$?"
grep -v Warn $OUT/ksplit.log | cut -c1-400 | tail -6
