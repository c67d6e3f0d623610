# Session 30, call 3: flashfuse bench attention, S = 4096..16384, fwd and bwd, hd64 / hd128, causal / full, beside cuDNN,
# FA2 (SDPA flash) and FlexAttention (compiled, dynamic shapes) in one run (eager timing, the bench's default); then the
# same rows CUDA-graph timed without Flex
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
ONLY='^(fwd|bwd) hd(64|128) (full|causal) S=(4096|8192|16384) '
timeout 380 python3 -m flashfuse.cli bench attention --providers flashfuse,sdpa-cudnn,sdpa-flash,flex --only "$ONLY" --no-progress --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$?"
timeout 170 python3 -m flashfuse.cli bench attention --cuda-graph --providers flashfuse,sdpa-cudnn,sdpa-flash --only "$ONLY" --no-progress --out $OUT/graph > $OUT/graph.log 2>&1
echo "graph rc=$?"
python3 - <<'PY'
import json, os
for mode in ("bench", "graph"):
    try:
        r = json.load(open(os.path.join(os.environ["OUT"], mode, "results.json")))
    except Exception as e:
        print(mode, "no results", e); continue
    by = {}
    for x in r["rows"]:
        if isinstance(x, dict) and x.get("tflops"):
            by.setdefault(x["case"], {})[x["provider"]] = x["tflops"]
    for case, p in by.items():
        f, c, fa, fl = p.get("flashfuse"), p.get("sdpa-cudnn"), p.get("sdpa-flash"), p.get("flex")
        print(f"{mode} {case:32s} ff {f:6.1f} cudnn {c:6.1f} fa2 {fa:6.1f} flex {fl or 0:6.1f}  {f / c:.2f}x cudnn  {f / fa:.2f}x fa2" + (f"  {f / fl:.2f}x flex" if fl else ""))
PY
