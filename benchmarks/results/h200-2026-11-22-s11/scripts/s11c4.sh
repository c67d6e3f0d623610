# Session 11, call 4: GroupNorm LAG design with tensor-descriptor tiles and deep pipelines (NCHW).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
timeout 300 python3 .gpu/s11_lagtma_probe.py 2>&1 | tee $OUT/lagtma_probe.log | grep -v Warning
