export PYTHONPATH=$PWD/src
python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_launch_cache.py 2>&1 | grep -v "Warning\|warner" | tail -4
DIMS=128,256 SEQS=2048 NAMES=gluon,cudnn TAG=c8 python3 .gpu/wide.py 2>&1 | tee $OUT/wide_c8.log
