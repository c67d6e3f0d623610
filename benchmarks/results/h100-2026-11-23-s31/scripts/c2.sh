export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
ROUNDS=3 timeout 400 python3 .gpu/s31/ab.py all > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep -v "^r[0-9]\|Warn" $OUT/ab.log | tail -24
