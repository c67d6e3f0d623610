# Session 24, call 2: where the Gluon backward's time goes: variants, ncu
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT
PYTHONPATH=$PWD/src timeout 200 python3 .gpu/s24_breakdown.py > $OUT/breakdown.log 2>&1; echo "breakdown rc=$?"
grep -v Warn $OUT/breakdown.log | cut -c1-300 | tail -12
export PYTHONPATH=$PWD/src
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__registers_per_thread,launch__grid_size,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
for s in long_scoreboard barrier membar lg_throttle drain wait math_pipe_throttle mio_throttle short_scoreboard no_instruction not_selected selected dispatch_stall branch_resolving sleeping; do
  M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
timeout 150 ncu --clock-control none --print-summary none --csv --kernel-name regex:"bwd_hopper" --launch-skip 2 --launch-count 1 --metrics $M python3 .gpu/s24_ncu_probe.py > $OUT/ncu24.csv 2> $OUT/ncu24.err
echo "ncu rc=$?"; tail -3 $OUT/ncu24.err
python3 - <<'PY'
import csv, os, collections
rows = list(csv.reader(l for l in open(os.environ["OUT"] + "/ncu24.csv") if l.startswith('"')))
hdr = rows[0]; idx = {h: i for i, h in enumerate(hdr)}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[idx["ID"]], r[idx["Kernel Name"]][:30])
    k.setdefault(key, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]]
for (i, name), m in k.items():
    short = {a.replace("smsp__average_warps_issue_stalled_", "st_").replace("_per_issue_active.ratio", ""): v for a, v in m.items()}
    stalls = sorted(((float(v.replace(',', '')), a) for a, v in short.items() if a.startswith("st_")), reverse=True)[:8]
    print(f"{i:>3} {name:30s} t={m.get('gpu__time_duration.sum')} rd={m.get('dram__bytes_read.sum')} wr={m.get('dram__bytes_write.sum')} dram%={m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed')} issue%={m.get('smsp__issue_active.avg.pct_of_peak_sustained_active')} inst={m.get('smsp__inst_executed.sum')} regs={m.get('launch__registers_per_thread')} bankc={m.get('l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum')}")
    print("     " + "  ".join(f"{a[3:]}={v:.2f}" for v, a in stalls))
PY
