export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_wide_gpu.py -k "tail or padded or table or 160 or 192 or 144 or 176 or wide" > $OUT/tests_c1.log 2>&1
tail -25 $OUT/tests_c1.log
TAG=c1 python3 -u .gpu/tail_sweep.py > $OUT/sweep_c1.log 2>&1
cat $OUT/sweep_c1.log
