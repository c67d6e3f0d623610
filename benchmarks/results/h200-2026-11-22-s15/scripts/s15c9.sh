# Session 15, call 9: host overhead of the Gluon path (do_bench vs CUDA-graph replay, Gluon on / off).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 python3 .gpu/s15_host.py 2>&1 | tee $OUT/s15_host.log | grep -v Warning
