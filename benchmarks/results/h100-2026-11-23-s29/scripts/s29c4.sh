# Session 29, call 4: hd64 causal, 128-key tiles with 3 / 4 stages, KV_JOINT on / off, beside the table
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s29/scripts
timeout 300 python3 $S/s29_st.py > $OUT/s29_st.log 2>&1; echo "st rc=$?"
grep -v Warn $OUT/s29_st.log | tail -4
