# Session 30, call 2: GPU tier of the attention tests (hd128 causal from 2K keys with SPLIT_PV_WAIT), the on / off A/B,
# and flashfuse bench attention hd128 causal S = 2048..16384 (fwd) beside cuDNN and FA2, CUDA-graph timed
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s30/scripts
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_launch_cache.py > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/tests.log
timeout 200 python3 $S/s30_ab2.py > $OUT/ab2.log 2>&1; echo "ab2 rc=$?"
grep -v "^round\|Warn" $OUT/ab2.log | tail -6
timeout 150 python3 -m flashfuse.cli bench attention --cuda-graph --providers flashfuse,sdpa-cudnn,sdpa-flash --only '^fwd hd128 causal S=(2048|4096|8192|16384) ' --no-progress --out $OUT/graph > $OUT/graph.log 2>&1; echo "graph rc=$?"
grep "fwd hd128" $OUT/graph.log | tail -8
