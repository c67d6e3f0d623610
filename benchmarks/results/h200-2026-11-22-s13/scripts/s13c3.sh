# Session 13, call 3: read-once GroupNorm forward with TMA-pipelined chunks and a bounded unrolled meeting.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 500 python3 .gpu/s13_tma_probe.py > $OUT/tma_probe.log 2>&1
echo "probe rc=$?"; grep -v "^  " $OUT/tma_probe.log | tail -30
