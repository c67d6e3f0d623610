# Session 13, call 4: ncu warp-state and memory counters of the read-once bodies vs clone and the default plan.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__grid_size
for s in long_scoreboard barrier membar lg_throttle drain wait math_pipe_throttle mio_throttle short_scoreboard no_instruction not_selected selected dispatch_stall branch_resolving imc_miss sleeping; do
  M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
timeout 300 ncu --clock-control none --nvtx --nvtx-include "clone/" --nvtx-include "default/" --nvtx-include "coop_m0/" --nvtx-include "coop_m1/" --nvtx-include "tma_m0/" --print-summary none --csv --metrics $M python3 .gpu/s13_ncu_probe.py > $OUT/ncu13.csv 2> $OUT/ncu13.err
echo "ncu rc=$?"; tail -3 $OUT/ncu13.err
python3 - <<'PY'
import csv, os, collections
rows = list(csv.reader(l for l in open(os.environ["OUT"] + "/ncu13.csv") if l.startswith('"')))
hdr = rows[0]; idx = {h: i for i, h in enumerate(hdr)}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[idx["ID"]], r[idx["Kernel Name"]][:34])
    k.setdefault(key, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]]
for (i, name), m in k.items():
    short = {a.replace("smsp__average_warps_issue_stalled_", "st_").replace("_per_issue_active.ratio", ""): v for a, v in m.items()}
    stalls = sorted(((float(v.replace(',', '')), a) for a, v in short.items() if a.startswith("st_")), reverse=True)[:6]
    print(f"{i:>3} {name:34s} t={m.get('gpu__time_duration.sum')} rd={m.get('dram__bytes_read.sum')} dram%={m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed')} warps%={m.get('sm__warps_active.avg.pct_of_peak_sustained_active')} issue%={m.get('smsp__issue_active.avg.pct_of_peak_sustained_active')} regs={m.get('launch__registers_per_thread')} grid={m.get('launch__grid_size')}")
    print("     " + "  ".join(f"{a[3:]}={v:.2f}" for v, a in stalls))
PY
