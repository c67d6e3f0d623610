export PYTHONPATH=$PWD/src
python .gpu/swa.py 2>&1 | grep -v Warning | tee $OUT/swa.log
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_flash_attn_gpu.py -k "not slow" 2>&1 | tail -3 | tee $OUT/fa_gpu.log
