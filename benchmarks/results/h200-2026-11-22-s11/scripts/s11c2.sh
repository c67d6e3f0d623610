# Session 11, call 2: polynomial exp2 in the attention forward (POLY_EXP2 knob), bf16 then fp16.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; cat COMMIT
timeout 330 python3 .gpu/s11_poly_probe.py 2>&1 | tee $OUT/poly_probe.log | grep -v Warning
