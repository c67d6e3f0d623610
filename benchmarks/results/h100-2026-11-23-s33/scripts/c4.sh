# Session 33, call 4: PDL in the Gluon GroupNorm kernels: GN GPU tier; A/B fwd / fwd+bwd vs HEAD without PDL
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py -rf --tb=short 2>&1 | grep -v "Warn\|warnings.warn\|jit/_script" | tail -6 > $OUT/gn_gpu_tests.log
tail -3 $OUT/gn_gpu_tests.log
for i in 1 2; do
  PYTHONPATH=$PWD/.gpu/old/src python3 .gpu/s33/gn_time2.py old $OUT/old$i.json
  python3 .gpu/s33/gn_time2.py pdl $OUT/pdl$i.json
done > $OUT/ab_pdl.log 2>&1
grep -v Warn $OUT/ab_pdl.log | tail -32
