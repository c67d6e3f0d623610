export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py -k "softcap or alibi" > $OUT/tests_c5.log 2>&1
tail -5 $OUT/tests_c5.log
