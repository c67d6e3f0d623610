import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if not rows:
    sys.exit(print("no rows"))
hdr = rows[0]; idx = {h: i for i, h in enumerate(hdr)}
k = collections.OrderedDict()
for r in rows[1:]:
    k.setdefault((r[idx["ID"]], r[idx["Kernel Name"]][:30]), {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]]
for (i, name), m in k.items():
    st = {a.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""): v
          for a, v in m.items() if a.startswith("smsp__average_warps_issue_stalled_")}
    stalls = sorted(((float(v.replace(',', '')), a) for a, v in st.items()), reverse=True)[:8]
    print(f"{i:>3} {name} t={m.get('gpu__time_duration.sum')} rd={m.get('dram__bytes_read.sum')} "
          f"wr={m.get('dram__bytes_write.sum')} dram%={m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed')} "
          f"issue%={m.get('smsp__issue_active.avg.pct_of_peak_sustained_active')} inst={m.get('smsp__inst_executed.sum')} "
          f"clk={m.get('sm__cycles_elapsed.avg.per_second')} warps%={m.get('sm__warps_active.avg.pct_of_peak_sustained_active')} "
          f"bankc={m.get('l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum')}")
    print("     " + "  ".join(f"{a}={v:.2f}" for v, a in stalls))
