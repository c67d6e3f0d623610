# Session 12, call 4: LAG as one pipelined loop (prefetch across group boundaries) vs nested LAG.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 400 python3 .gpu/s12_flat2_probe.py > $OUT/flat2_probe.log 2>&1
echo "probe rc=$?"; cat $OUT/flat2_probe.log | tail -60
