export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_wide_gpu.py -k "hopper_backward or wide" > $OUT/tier_c1.log 2>&1
grep -v "Warning\|warner" $OUT/tier_c1.log | tail -8
python3 -u .gpu/bwd_sweep.py > $OUT/sweep_c1.log 2>&1
cat $OUT/sweep_c1.log
