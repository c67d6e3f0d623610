export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
D=160 CAUSAL=0 timeout 420 python3 .gpu/s36/bwd256.py 2>&1 | grep -v Warn | tee $OUT/bwd256.log
