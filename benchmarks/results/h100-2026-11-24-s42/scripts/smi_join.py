"""Mean SM clock / power per probe window: python3 smi_join.py rows.json smi.csv"""
import csv, json, sys, datetime
rows = json.load(open(sys.argv[1]))
smi = []
for rec in csv.reader(open(sys.argv[2])):
    if not rec or rec[0].startswith("timestamp"):
        continue
    try:
        t = datetime.datetime.strptime(rec[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        smi.append((t, float(rec[1].split()[0]), float(rec[2].split()[0]), rec[3].strip()))
    except Exception:
        pass
for r in rows:
    w = [s for s in smi if r["t0"] + 0.4 <= s[0] <= r["t1"]]
    clk = sum(s[1] for s in w) / max(len(w), 1)
    pw = sum(s[2] for s in w) / max(len(w), 1)
    thr = sorted({s[3] for s in w})
    print(f"{r['rnd']} {r['mode']} hd{r['D']} {'causal' if r['causal'] else 'full'} S={r['S']} {r['dtype']:9s} "
          f"{r['prov']:6s} {r['tflops']:6.1f} TFLOP/s  {clk:6.0f} MHz {pw:5.0f} W  n={len(w)} {thr}")
