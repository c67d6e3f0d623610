# Session 34, call 4: GroupNorm + SiLU routes at SD-1.5 batch-2 levels vs torch.compile (fwd / fwd+bwd us)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 .gpu/s34/small_routes.py 2>&1 | tee $OUT/small_routes.log | grep -v -i warn
