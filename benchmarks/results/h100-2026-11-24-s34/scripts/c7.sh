# Session 34, call 7: NCHW channel blocks in the LOOP plan (Triton plans forced, as off sm_90) at larger batches
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
NO_HOPPER=1 SHAPES=16x960x32x32,8x960x32x32,16x1920x32x32,8x1920x16x16,16x2880x16x16,16x640x32x32 timeout 400 python3 .gpu/s34/padded_ab.py 2>&1 | tee $OUT/padded_loop.log | grep -v -i warn
