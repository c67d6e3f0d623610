# Session 34, call 9: padded NCHW blocks in SPLIT only: GN GPU tier; batch-2 A/B; LOOP unchanged (check)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/gn_gpu_tests.log 2>&1
echo "gn gpu rc=$?"; tail -1 $OUT/gn_gpu_tests.log
SHAPES=2x960x32x32,1x960x32x32,2x1920x32x32,2x1440x32x32,2x2880x16x16,2x3840x16x16,2x480x32x32 timeout 250 python3 .gpu/s34/padded_ab.py 2>&1 | tee $OUT/padded_final.log | grep -v -i warn
