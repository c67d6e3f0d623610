# Session 11, call 6: the ceiling of the LAG loop structure (TMA-load / pointer-store streaming, with and without the re-read).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
timeout 330 python3 .gpu/s11_stream_probe.py 2>&1 | tee $OUT/stream_probe.log | grep -v Warning
