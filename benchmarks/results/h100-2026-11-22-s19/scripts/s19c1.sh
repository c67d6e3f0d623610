# Session 19, call 1: the per-channel time-embedding fix (RES_PER_CHANNEL): GPU tier of group_norm and
# patch_diffusers; before / after probe in the same run (.snap/pre19 = commit 36ecd30); bench diffusion.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
cat .gpu/COMMIT
PYTHONPATH=/tmp/site:$PWD/src timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py tests/test_patch_diffusers_gpu.py > $OUT/pytest_gn_patch.log 2>&1
echo "pytest rc=$?"; tail -2 $OUT/pytest_gn_patch.log | cut -c1-300
PYTHONPATH=$PWD/.snap/pre19/src timeout 150 python3 .gpu/s19_temb_probe.py before > $OUT/temb_before.log 2>&1; echo "before rc=$?"
PYTHONPATH=$PWD/src timeout 150 python3 .gpu/s19_temb_probe.py after > $OUT/temb_after.log 2>&1; echo "after rc=$?"
PYTHONPATH=/tmp/site:$PWD/src timeout 200 python3 -m flashfuse.cli bench diffusion --cuda-graph --providers flashfuse,eager,compile --only "group_norm" --no-progress --out $OUT/diffusion-graph > $OUT/bench_diffusion.log 2>&1
echo "bench rc=$?"
paste -d'|' $OUT/temb_before.log $OUT/temb_after.log | cut -c1-260
tail -24 $OUT/bench_diffusion.log | cut -c1-130
