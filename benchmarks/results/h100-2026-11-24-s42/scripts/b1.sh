# full flash-attn-shape bench, one dtype per call: bash .gpu/b1.sh bf16|fp16
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
ONLY='^(fwd|bwd) hd(64|128) (full|causal) S='
timeout 560 python3 -m flashfuse.cli bench attention --dtype $1 --providers flashfuse,sdpa-cudnn,sdpa-flash,sdpa-efficient,flex --only "$ONLY" --no-progress --out $OUT/bench-$1 > $OUT/bench-$1.log 2>&1
echo "bench rc=$?"; tail -3 $OUT/bench-$1.log
python3 .gpu/summary.py $OUT/bench-$1 | tee $OUT/summary-$1.txt
