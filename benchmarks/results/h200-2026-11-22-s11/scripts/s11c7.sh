# Session 11, call 7: LAG as one flattened pipelined loop (per-lane shifts, in-loop finalize).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
timeout 330 python3 .gpu/s11_lagflat_probe.py 2>&1 | tee $OUT/lagflat_probe.log | grep -v Warning
