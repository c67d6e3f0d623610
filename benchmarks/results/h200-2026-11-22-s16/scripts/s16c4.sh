# Session 16, call 4: where a flash_attn_func call's host time goes (forward and the Gluon backward).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 python3 .gpu/s16_host.py > $OUT/host.log 2>&1; echo "host rc=$?"
grep -E "us/call" $OUT/host.log
