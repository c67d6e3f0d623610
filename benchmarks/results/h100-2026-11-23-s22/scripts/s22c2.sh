# Session 22, call 2: row-layout hd64 backward variants: c (dQ issued first, its store beside dK; P and dS behind one barrier), d (c without the one barrier + rotated walk), e (one barrier only). b (dQ first alone) crashes ptxas (SIGSEGV) with divisibility specializations.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT
for v in c d e; do cp .gpu/v_$v.py src/flashfuse/ops/attention/_v_$v.py; done
VARIANTS=c,d,e timeout 500 python3 .gpu/s22_bwd.py 2>&1 | tee $OUT/bwd.log | grep -v Warning
