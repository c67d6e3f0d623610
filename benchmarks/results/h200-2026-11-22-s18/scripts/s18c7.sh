# Session 18, call 7: GPU tier of group_norm at the final commit (docs + dtype guard after call 6).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_gn_final.log 2>&1
echo "pytest rc=$?"; tail -1 $OUT/pytest_gn_final.log | cut -c1-300
