# Session 15, call 1: warp-specialized Gluon forward - correctness and sweep vs flashfuse (shipped path) and cuDNN.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 500 python3 .gpu/s15_ws.py 2>&1 | tee $OUT/s15_ws.log | grep -v Warning
