# Session 21, call 10: CL Gluon normalize releasing slots in pairs (half the barriers): CL GPU tests, A/B
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
git diff --stat HEAD | tail -1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py -k "channels_last or repeats" > $OUT/pytest_cl.log 2>&1
echo "pytest cl rc=$?"; grep -E "passed|failed|FAILED" $OUT/pytest_cl.log | tail -6 | cut -c1-300
timeout 200 python3 .gpu/s21_ab.py 2>&1 | grep -v Warn | tee $OUT/ab.log
