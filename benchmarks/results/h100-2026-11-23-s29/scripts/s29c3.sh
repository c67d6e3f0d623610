# Session 29, call 3: KV_JOINT (one K / V release per key block) beside the table's configs
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s29/scripts
timeout 300 python3 $S/s29_joint.py > $OUT/s29_joint.log 2>&1; echo "joint rc=$?"
grep -v Warn $OUT/s29_joint.log | tail -9
