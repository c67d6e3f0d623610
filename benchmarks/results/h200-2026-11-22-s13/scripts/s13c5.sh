# Session 13, call 5: read-once bodies with the fast SiLU.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 500 python3 .gpu/s13_fast_probe.py > $OUT/fast_probe.log 2>&1
echo "probe rc=$?"; grep -v "^  " $OUT/fast_probe.log | tail -30
