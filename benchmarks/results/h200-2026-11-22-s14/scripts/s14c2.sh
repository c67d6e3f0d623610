# Session 14, call 2: Gluon Hopper forward with P through shared memory (double-buffered, stored before the P V wait) - correctness and sweep vs flashfuse Triton forward and cuDNN.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 540 python3 .gpu/s14_gluon.py 2>&1 | tee $OUT/s14_gluon.log | grep -v Warning
