# Session 12, call 3: LAG forward with 8-16 warp programs at ~0.5-2 programs per SM.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 400 python3 .gpu/s12_lag3_probe.py > $OUT/lag3_probe.log 2>&1
echo "probe rc=$?"; cat $OUT/lag3_probe.log | tail -60
