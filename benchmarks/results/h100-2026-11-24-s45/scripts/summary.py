"""Ratios of bench runs: python3 summary.py DIR... (each holding results.json)."""
import json, os, sys
for out in sys.argv[1:]:
    try:
        r = json.load(open(os.path.join(out, "results.json")))
    except Exception as e:
        print(out, "no results", e); continue
    by = {}
    for x in r["rows"]:
        if isinstance(x, dict) and x.get("tflops"):
            by.setdefault(x["case"], {})[x["provider"]] = x["tflops"]
    for case, p in by.items():
        f, c, fa, fl = p.get("flashfuse"), p.get("sdpa-cudnn"), p.get("sdpa-flash"), p.get("flex")
        if not (f and c and fa):
            print(case, p); continue
        print(f"{case:32s} ff {f:6.1f} cudnn {c:6.1f} fa2 {fa:6.1f} flex {fl or 0:6.1f}  {f / c:.2f}x cudnn  "
              f"{f / fa:.2f}x fa2" + (f"  {f / fl:.2f}x flex" if fl else ""))
