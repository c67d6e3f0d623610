# Session 12, call 1: LAG forward with trimmed per-element work (FORM 0/1/2) vs default and clone.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; cat COMMIT
timeout 420 python3 .gpu/s12_lag2_probe.py > $OUT/lag2_probe.log 2>&1
echo "probe rc=$?"; cat $OUT/lag2_probe.log | tail -12
