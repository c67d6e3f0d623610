# flash-attn-shape bench (ONLY: a row regex) with --rounds 3, one dtype per call: bash .gpu/b2.sh bf16|fp16
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 500 > $OUT/smi-$1.csv 2>&1 &
SMI=$!
ONLY="${ONLY:-^(fwd|bwd) hd(64|128) (full|causal) S=}"
timeout 570 python3 -m flashfuse.cli bench attention --rounds 3 --dtype $1 --providers flashfuse,sdpa-cudnn,sdpa-flash,sdpa-efficient,flex --only "$ONLY" --no-progress --out $OUT/bench-$1 > $OUT/bench-$1.log 2>&1
echo "bench rc=$?"; kill $SMI; tail -2 $OUT/bench-$1.log
python3 .gpu/summary.py $OUT/bench-$1 | tee $OUT/summary-$1.txt
python3 - $OUT/bench-$1 <<'PY'
import json, sys, statistics
r = json.load(open(sys.argv[1] + "/results.json"))
sp = [max(x["ms_rounds"]) / min(x["ms_rounds"]) - 1 for x in r["rows"] if x.get("ms_rounds")]
print(f"round spread (max/min - 1): median {statistics.median(sp):.3f}, p90 {sorted(sp)[int(0.9 * len(sp))]:.3f}, max {max(sp):.3f}")
PY
