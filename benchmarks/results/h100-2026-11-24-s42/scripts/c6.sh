# GroupNorm + SiLU rows (SD-1.5, training-size and SDXL levels), graph-timed, --rounds 3
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 560 python3 -m flashfuse.cli bench diffusion --cuda-graph --rounds 3 --providers flashfuse,eager,compile --only "group_norm" --no-progress --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$?"; tail -60 $OUT/bench.log
