export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python .gpu/ab_parts.py 2>&1 | tee $OUT/ab_parts.log
python -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py 2>&1 | tail -5 | tee $OUT/gn_gpu.log
