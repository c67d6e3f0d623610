# Session 31, call 3: GPU tier at 7047eaf; flashfuse bench attention S = 512..2048 (fwd, bwd; hd64 / hd128; causal /
# full) beside cuDNN, FA2 (SDPA flash) and FlexAttention in one run (eager), then CUDA-graph timed without Flex
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/tests.log
ONLY='^(fwd|bwd) hd(64|128) (full|causal) S=(512|1024|2048) '
timeout 230 python3 -m flashfuse.cli bench attention --providers flashfuse,sdpa-cudnn,sdpa-flash,flex --only "$ONLY" --no-progress --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc=$?"
timeout 130 python3 -m flashfuse.cli bench attention --cuda-graph --providers flashfuse,sdpa-cudnn,sdpa-flash --only "$ONLY" --no-progress --out $OUT/graph > $OUT/graph.log 2>&1
echo "graph rc=$?"
python3 benchmarks/results/h100-2026-11-23-s31/scripts/summary.py $OUT | tee $OUT/summary.txt
