# Session 34, call 5: GN GPU tier with padded NCHW channel blocks; A/B padded vs dividing blocks at batch-2 SD levels
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/gn_gpu_tests.log 2>&1
echo "gn gpu rc=$?"; tail -3 $OUT/gn_gpu_tests.log
timeout 360 python3 .gpu/s34/padded_ab.py 2>&1 | tee $OUT/padded_ab2.log | grep -v -i warn
