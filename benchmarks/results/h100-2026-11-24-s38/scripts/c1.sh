set -x
export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py -k "hopper_backward and (d160 or d256 or fp32_grads)" -x 2>&1 | tail -15
TAG=c1 python3 .gpu/wide.py 2>&1 | tee $OUT/wide_c1.log
