import json, os, sys
out, labels = sys.argv[1], sys.argv[2:]
runs = {l: {(r["d"], r["causal"], r["s"], r["mode"]): r for r in json.load(open(os.path.join(out, f"drop_time51_{l}.json")))}
        for l in labels if os.path.exists(os.path.join(out, f"drop_time51_{l}.json"))}
new = runs["new"]
print("d c S mode | " + " ".join(labels) + " | t64 nodrop fa2 cudnn | " + " ".join(f"new/{l}" for l in labels[1:])
      + " new/fa2 new/cudnn")
for k, r in new.items():
    n = r.get("new-drop") or 0
    f = lambda x: f"{n / x:.2f}" if x else "-"
    others = [runs[l].get(k, {}).get(f"{l}-drop") for l in labels[1:] if l in runs]
    print(f"{k[0]} {int(k[1])} {k[2]} {k[3]} | {n} " + " ".join(str(o) for o in others)
          + f" | {r.get('new-drop-triton64', '-')} {r.get('nodrop')} {r.get('fa2-drop')} {r.get('cudnn-drop')} | "
          + " ".join(f(o) for o in others) + f" {f(r.get('fa2-drop'))} {f(r.get('cudnn-drop'))}")
