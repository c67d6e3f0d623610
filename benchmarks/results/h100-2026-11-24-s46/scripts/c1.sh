export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py -k "padded or table or tail" > $OUT/tests_c1.log 2>&1
tail -15 $OUT/tests_c1.log
TAG=c1 python3 -u .gpu/tail_sweep46.py > $OUT/sweep_c1.log 2>&1
cat $OUT/sweep_c1.log
