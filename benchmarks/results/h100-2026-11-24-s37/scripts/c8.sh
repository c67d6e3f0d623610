export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_window_gpu.py 2>&1 | tail -4 | tee $OUT/window_gpu.log
python .gpu/swa.py 2>&1 | grep -v Warning | tee $OUT/swa.log
for r in 1 2; do
  PYTHONPATH=$PWD/.gpu/old_src/src python .gpu/fwd_rates.py old
  PYTHONPATH=$PWD/src python .gpu/fwd_rates.py new
done 2>&1 | grep -v Warn | tee $OUT/ab.log
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py -k "not slow" 2>&1 | tail -3 | tee $OUT/fa_gpu.log
