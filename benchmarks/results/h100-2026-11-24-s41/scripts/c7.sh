export PYTHONPATH=$PWD/src
for hd in 64 128 256; do for c in 0 1; do
  if CUDA_LAUNCH_BLOCKING=1 python3 .gpu/dbg.py $hd $c > $OUT/dbg_${hd}_$c.log 2>&1; then echo "hd$hd c$c ok"; else echo "hd$hd c$c FAILED"; grep -v Warn $OUT/dbg_${hd}_$c.log | tail -4; exit 1; fi
done; done
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_wide_gpu.py 2>&1 | grep -v "Warning\|warner" | grep -E "passed|failed|FAILED|Error|assert" | tail -30 | tee $OUT/varlen_tests.log
for r in 1 2; do
  for t in old new; do
    if [ $t = old ]; then src=$PWD/.gpu/old_src/src; else src=$PWD/src; fi
    echo "== round $r $t" | tee -a $OUT/ab.log
    PYTHONPATH=$src python3 .gpu/varlen_ab.py $src 2>&1 | tail -12 | tee -a $OUT/ab.log
  done
done
