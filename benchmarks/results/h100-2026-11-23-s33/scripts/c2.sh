export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py -rf --tb=short 2>&1 | grep -v "^  warnings\|Warning" | tail -150 > $OUT/new_tests.log
PYTHONPATH=$PWD/.gpu/old/src python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py -rf --tb=line 2>&1 | tail -15 > $OUT/old_tests.log
grep -E "^(FAILED|E  )|passed|failed" $OUT/new_tests.log | head -60
echo ---- old; tail -12 $OUT/old_tests.log
