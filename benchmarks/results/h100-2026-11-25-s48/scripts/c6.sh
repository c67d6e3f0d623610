export PYTHONPATH=$PWD/src
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_modulation_gpu.py tests/test_norm_gpu.py > $OUT/tests_c6.log 2>&1
tail -4 $OUT/tests_c6.log
