# Session 34, call 1: SFU-class throughput microbench; GroupNorm forward's pipe utilisation (ncu raw, ComputeWorkloadAnalysis)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=.gpu/s34
timeout 120 python3 $S/xu_bench.py > $OUT/xu.log 2>&1; echo "xu rc=$?"; cat $OUT/xu.log | grep -v Warn
P=benchmarks/results/h100-2026-11-23-s28/scripts/s28_ncu_probe.py
timeout 200 ncu --clock-control none --kernel-name regex:fwd_hopper --launch-skip 2 --launch-count 1 --section ComputeWorkloadAnalysis --section InstructionStats --page raw --csv python3 $P > $OUT/ncu_pipes.csv 2> $OUT/ncu_pipes.err
echo "ncu rc=$?"
python3 - <<'PY'
import csv, os
rows = [r for r in csv.reader(l for l in open(os.environ["OUT"] + "/ncu_pipes.csv") if l.startswith('"'))]
hdr, vals = rows[0], rows[-1]
for h, v in zip(hdr, vals):
    if "pipe" in h and ("pct" in h or h.endswith(".sum")) and v not in ("0", "", "n/a"):
        print(f"{h:90s} {v}")
PY
