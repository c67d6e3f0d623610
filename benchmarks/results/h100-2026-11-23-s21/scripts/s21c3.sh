# Session 21, call 3: fences in both Gluon forwards, CL 64-pixel tiles only: GN + patch_diffusers GPU tier; CL probe
# (with the old 32-pixel plans as gluon32); temb probe before (619aa9d, .snap/pre21) / after; bench diffusion (group_norm)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD/src timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED" $OUT/pytest_gn_patch.log | tail -8 | cut -c1-300
PYTHONPATH=$PWD/src timeout 150 python3 .gpu/s21_cl_probe.py > $OUT/cl_probe.log 2>&1; echo "probe rc=$?"
PYTHONPATH=$PWD/.snap/pre21/src timeout 150 python3 .gpu/s19_temb_probe.py before > $OUT/temb_before.log 2>&1; echo "before rc=$?"
PYTHONPATH=$PWD/src timeout 150 python3 .gpu/s19_temb_probe.py after > $OUT/temb_after.log 2>&1; echo "after rc=$?"
PYTHONPATH=/tmp/site:$PWD/src timeout 200 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out $OUT/diffusion-graph > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"
cut -c1-200 $OUT/cl_probe.log | grep -v Warn
paste -d'|' $OUT/temb_before.log $OUT/temb_after.log | cut -c1-260
tail -24 $OUT/bench_diffusion.log | cut -c1-130
