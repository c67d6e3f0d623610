set -x
export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_group_norm_gpu.py 2>&1 | tail -4
for i in 1 2; do
  PYTHONPATH=$PWD/.gpu/old/src python3 .gpu/s33/gn_time.py old $OUT/old$i.json
  python3 .gpu/s33/gn_time.py new $OUT/new$i.json
done 2>&1 | tee $OUT/ab.log
python3 .gpu/s33/attn_prof.py 2>&1 | tee $OUT/prof.log
