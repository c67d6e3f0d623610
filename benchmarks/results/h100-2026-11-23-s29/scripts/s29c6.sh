# Session 29, call 6: flashfuse bench attention, fwd and bwd rows S = 512..2048 at c09cdf8 (hd64 causal from 1K: 128-key tiles,
# 3 stages), eager and CUDA-graph timed, beside SDPA's cuDNN and flash backends (same run)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
ONLY='^(fwd|bwd) hd(64|128) (full|causal) S=(512|1024|2048) '
timeout 280 python3 -m flashfuse.cli bench attention --providers flashfuse,sdpa-cudnn,sdpa-flash --only "$ONLY" --no-progress --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$?"
timeout 280 python3 -m flashfuse.cli bench attention --cuda-graph --providers flashfuse,sdpa-cudnn,sdpa-flash --only "$ONLY" --no-progress --out $OUT/graph > $OUT/graph.log 2>&1
echo "graph rc=$?"
python3 - <<'PY'
import json, os
for mode in ("bench", "graph"):
    r = json.load(open(os.path.join(os.environ["OUT"], mode, "results.json")))
    rows = r["rows"]
    by = {}
    for x in rows:
        if isinstance(x, dict) and x.get("tflops"):
            by.setdefault(x["case"], {})[x["provider"]] = x["tflops"]
    for case, p in by.items():
        f, c, fa = p.get("flashfuse"), p.get("sdpa-cudnn"), p.get("sdpa-flash")
        print(f"{mode} {case:32s} ff {f:6.1f} cudnn {c:6.1f} fa2 {fa:6.1f}  {f / c:.2f}x cudnn  {f / fa:.2f}x fa2")
PY
