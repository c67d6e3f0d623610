export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
for D in 160 256; do for C in 0 1; do D=$D CAUSAL=$C timeout 150 python3 .gpu/s36/bwd256.py 2>&1 | grep -v Warn | tee -a $OUT/bwd256.log; done; done
