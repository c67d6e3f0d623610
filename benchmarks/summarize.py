"""Markdown tables from a committed results.json (what the README and docs show).

    python benchmarks/summarize.py benchmarks/results/h200-2026-11-21/attention/results.json [--only REGEX]
        [--providers a,b,c] [--metric tflops|gbps|ms|peak_mem_MiB|per_s]

``per_s`` is throughput from ``ms`` and the case's params: tokens/s for the models suite's LLM rows
(``tokens``), steps/s (it/s) for its diffusion loop (``steps``), samples/s for the DiT step (``B``).

One row per case, one column per provider: the metric, or the status (OOM, SKIP, ...) where there is none.
"""

import argparse
import json
import re


def fmt(row, metric):
    if row is None:
        return ""
    if row["status"] != "OK":
        return row["status"]
    if metric == "peak_mem_MiB":
        value = None if row.get("peak_mem_bytes") is None else row["peak_mem_bytes"] / 2**20
    elif metric == "per_s":
        p = row.get("params", {})
        count = p.get("tokens", p.get("steps", p.get("B")))
        value = None if count is None or not row.get("ms") else count / (row["ms"] * 1e-3)
    else:
        value = row.get(metric)
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def table(doc, only=None, providers=None, metric=None):
    rows = [r for r in doc["rows"] if only is None or re.search(only, r["case"])]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    names = providers or list(dict.fromkeys(r["provider"] for r in rows))
    by_key = {(r["case"], r["provider"]): r for r in rows}
    suite_metric = {s["name"]: s.get("metric") for s in doc.get("suites", [])}
    metric = metric or suite_metric.get(rows[0]["suite"] if rows else None) or "tflops"
    lines = [f"| case ({metric}) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for case in cases:
        cells = [fmt(by_key.get((case, name)), metric) for name in names]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--only", default=None, help="regex on case names")
    ap.add_argument("--providers", default=None, help="comma-separated columns, in order")
    ap.add_argument("--metric", default=None)
    args = ap.parse_args()
    with open(args.results) as f:
        doc = json.load(f)
    env, ceilings = doc["environment"], doc["ceilings"]
    print(f"<!-- {env.get('gpu') or env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}; "
          f"copy {ceilings.get('copy_GBps', 0):.0f} GB/s, bf16 matmul {ceilings.get('matmul_TFLOPS', 0):.0f} TFLOP/s -->")
    print(table(doc, args.only, args.providers.split(",") if args.providers else None, args.metric))


if __name__ == "__main__":
    main()
