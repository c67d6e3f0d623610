# Session 13, call 2 (and 1): cooperative read-once GroupNorm forward (chunks in registers, in-kernel meeting) vs default.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; cat COMMIT
timeout 500 python3 .gpu/s13_coop_probe.py > $OUT/coop_probe2.log 2>&1
echo "probe rc=$?"; grep -v "^  " $OUT/coop_probe2.log | tail -30
