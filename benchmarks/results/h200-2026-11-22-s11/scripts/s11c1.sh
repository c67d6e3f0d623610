# Session 11, call 1: GroupNorm packed one-tile forward probe.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
timeout 300 python3 .gpu/s11_gn_probe.py 2>&1 | tee $OUT/gn_probe.log | tail -30
