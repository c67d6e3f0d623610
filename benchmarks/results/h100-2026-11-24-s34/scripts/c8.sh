# Session 34, call 8: MIN_RUN 64 (cpg 60 / 120 in blocks of 32): GN GPU tier; LOOP (Triton plans forced) and batch-2 A/B
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py > $OUT/gn_gpu_tests.log 2>&1
echo "gn gpu rc=$?"; tail -1 $OUT/gn_gpu_tests.log
NO_HOPPER=1 SHAPES=16x1920x32x32,8x1920x32x32,16x3840x16x16,16x960x32x32 timeout 200 python3 .gpu/s34/padded_ab.py 2>&1 | tee $OUT/padded_loop64.log | grep -v -i warn
SHAPES=2x1920x32x32,2x3840x16x16,1x1920x32x32,2x960x32x32 timeout 200 python3 .gpu/s34/padded_ab.py 2>&1 | tee $OUT/padded_small64.log | grep -v -i warn
