export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=2048 timeout 250 python3 .gpu/s36/dims.py 2>&1 | grep -v Warn | tee $OUT/dims_2048.log | tail -16
