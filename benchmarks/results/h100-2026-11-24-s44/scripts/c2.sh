export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py -k "not slow" > $OUT/tier_c2.log 2>&1
grep -v "Warning\|warner" $OUT/tier_c2.log | tail -8
for r in 1 2; do
  echo "== old (a5995b5) round $r" >> $OUT/ab_c2.log
  PYTHONPATH=$PWD/.gpu/base/src ROUNDS=1 DIMS=160,192,256 SEQS=1024,4096 python3 -u .gpu/bwd_sweep.py >> $OUT/ab_c2.log 2>&1
  echo "== new round $r" >> $OUT/ab_c2.log
  PYTHONPATH=$PWD/src ROUNDS=1 DIMS=160,192,256 SEQS=1024,4096 python3 -u .gpu/bwd_sweep.py >> $OUT/ab_c2.log 2>&1
done
cat $OUT/ab_c2.log
