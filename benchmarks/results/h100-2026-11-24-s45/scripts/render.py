"""Markdown rows and standings from a `flashfuse bench attention` results.json: python render.py RESULTS [hd128only]"""
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
t = {}
for r in rows:
    if r["status"] == "OK":
        t.setdefault(r["case"], {})[r["provider"]] = r["tflops"]
only128 = len(sys.argv) > 2
vs = {"cudnn": [], "fa2": [], "flex": []}
for case, p in t.items():
    ff, cu, fa, fl, ef = (p.get(k) for k in ("flashfuse", "sdpa-cudnn", "sdpa-flash", "flex", "sdpa-efficient"))
    vs["cudnn"].append((ff / cu, case)); vs["fa2"].append((ff / fa, case)); vs["flex"].append((ff / fl, case))
    if only128 and ("hd128" not in case or int(case.split("S=")[1].split()[0]) < 2048):
        continue
    cols = [ff, cu, fa, fl] + ([] if only128 else [ef])
    print(f"| {case} | " + " | ".join(f"{x:.0f}" for x in cols) + f" | {ff / cu:.2f}x | {ff / fa:.2f}x | {ff / fl:.2f}x |")
for k, v in vs.items():
    xs = sorted(x for x, _ in v)
    print(f"# vs {k}: {xs[0]:.2f}-{xs[-1]:.2f}x, >= 1.0x at {sum(x >= 0.995 for x in xs)} of {len(xs)}, >= 1.5x at "
          f"{sum(x >= 1.495 for x in xs)}; lowest: " + ", ".join(f"{c} {x:.2f}" for x, c in sorted(v)[:5]), file=sys.stderr)
