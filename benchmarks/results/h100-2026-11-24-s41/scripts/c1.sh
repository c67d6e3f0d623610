export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_varlen_gpu.py 2>&1 | grep -v "Warning\|warner" | grep -E "passed|failed|FAILED|Error|assert" | tail -30 | tee $OUT/varlen_tests.log
for r in 1 2; do
  for t in old new; do
    if [ $t = old ]; then src=$PWD/.gpu/old_src/src; else src=$PWD/src; fi
    echo "== round $r $t" | tee -a $OUT/ab.log
    PYTHONPATH=$src python3 .gpu/varlen_ab.py $src 2>&1 | tail -12 | tee -a $OUT/ab.log
  done
done
