export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 -x tests/test_flash_attn_varlen_gpu.py 2>&1 | grep -v "Warning\|warner" | tail -15 | tee $OUT/gpu_varlen.log
python3 .gpu/varlen_bwd_ab.py 2>&1 | tee $OUT/varlen_bwd_ab.log
