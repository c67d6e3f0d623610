export PYTHONPATH=$PWD/src
for hd in 64 128 256; do for c in 0 1; do
  if CUDA_LAUNCH_BLOCKING=1 python3 .gpu/dbg.py $hd $c > $OUT/dbg_${hd}_$c.log 2>&1; then echo "hd$hd c$c ok"; else echo "hd$hd c$c FAILED"; grep -v Warn $OUT/dbg_${hd}_$c.log | tail -4; exit 1; fi
done; done
for r in 1 2 3; do for v in v1 v3; do PYTHONPATH=$PWD/.gpu/$v/src python3 .gpu/fwd_ab.py $PWD/.gpu/$v/src $v 2>&1 | tail -1 | tee -a $OUT/fwd_ab.log; done; done
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_gpu.py tests/test_flash_attn_window_gpu.py tests/test_flash_attn_wide_gpu.py tests/test_launch_cache.py tests/test_ring_attention_gpu.py tests/test_hf_attention_gpu.py -k "not slow" 2>&1 | grep -v "Warning\|warner" | grep -E "passed|failed|FAILED|Error" | tail -15 | tee $OUT/gpu_tests.log
