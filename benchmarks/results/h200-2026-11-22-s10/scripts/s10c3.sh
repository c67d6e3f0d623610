# Session 10, call 3: conv1 bias folded into norm2's residual, 1x1-conv transformer projections as Linears;
# SD-1.5 kernel profile (patched); the diffusion model rows against eager / compile / compile reduce-overhead.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
PROF_RUNS=1 timeout 80 python3 .gpu/s10_prof_sd.py > $OUT/prof_sd15.log 2>&1
echo "prof rc=$?"; grep -E "=====|^  [a-z]" $OUT/prof_sd15.log | head -4; grep "other\]" $OUT/prof_sd15.log | head -8
timeout 480 python3 -m flashfuse.cli bench models --only "sd15|dit" --providers flashfuse-graph,hf-eager,hf-compile,hf-compile-graphs --no-progress --out $OUT/models-diffusion > $OUT/models_diffusion.log 2>&1
echo "bench rc=$?"; tail -8 $OUT/models_diffusion.log
