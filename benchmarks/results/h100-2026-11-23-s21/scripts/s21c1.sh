# Session 21, call 1: which variant of the s20 call-3 kernel fixes the multi-round + time-embedding outputs
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 .gpu/s20_variants.py 2>&1 | cut -c1-250 | tee $OUT/variants.log | grep -v Warning
