export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py -k "(hopper_backward and (d160 or d256 or fp32_grads)) or padded_head_dims" 2>&1 | grep -v "Warning\|warner" | tail -8
DIMS=160,192,256 SEQS=1024,2048,4096 NAMES=gluon,atomic,cudnn,fa2 TAG=c5 python3 .gpu/wide.py 2>&1 | tee $OUT/wide_c5.log
