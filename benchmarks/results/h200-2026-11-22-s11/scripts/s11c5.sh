# Session 11, call 5: LAG + TMA loads, second sweep: fast SiLU, pointer stores, 2-4 programs per SM, small tiles.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
timeout 300 python3 .gpu/s11_lagtma_probe.py 2>&1 | tee $OUT/lagtma2_probe.log | grep -v Warning
