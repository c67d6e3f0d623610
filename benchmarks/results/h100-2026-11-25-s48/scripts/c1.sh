export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py -k "softcap" > $OUT/tests_c1.log 2>&1
tail -15 $OUT/tests_c1.log
DIMS=64,128,256 SEQS=4096 ROUNDS=2 timeout 420 python3 -u .gpu/softcap_time48.py > $OUT/time_c1.log 2>&1
cat $OUT/time_c1.log
