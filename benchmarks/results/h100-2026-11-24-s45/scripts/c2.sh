export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 2 "tests/test_flash_attn_window_gpu.py::test_left_window_gluon_forward_gpu" tests/test_hf_attention_gpu.py > $OUT/tier_c2.log 2>&1
grep -v "Warning\|warner" $OUT/tier_c2.log | tail -4
python3 -u .gpu/varlen_ab45.py > $OUT/varlen_c2.log 2>&1; cat $OUT/varlen_c2.log
DTYPE=float16 python3 -u .gpu/bwd_sweep45.py > $OUT/sweep_fp16_c2.log 2>&1; cat $OUT/sweep_fp16_c2.log
