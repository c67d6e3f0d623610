# Session 28, call 2: globaltimer timeline of the NCHW forward (base, nostore); with / without the affine loads
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
timeout 120 python3 $S/s28_trace.py > $OUT/trace.log 2>&1; echo "trace rc=$?"
timeout 120 python3 $S/s28_trace.py --nostore > $OUT/trace_nostore.log 2>&1; echo "trace nostore rc=$?"
timeout 100 python3 $S/s28_noaff.py > $OUT/noaff.log 2>&1; echo "noaff rc=$?"
grep -v Warn $OUT/trace.log | cut -c1-250 | tail -22; grep -v Warn $OUT/trace_nostore.log | grep "==\|averages" | cut -c1-300; cat $OUT/noaff.log | tail -3
