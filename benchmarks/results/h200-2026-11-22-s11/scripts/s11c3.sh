# Session 11, call 3: GroupNorm LAG design probe (persistent programs, one-group lag, x read once from HBM).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
timeout 400 python3 .gpu/s11_lag_probe.py 2>&1 | tee $OUT/lag_probe.log | grep -v Warning
