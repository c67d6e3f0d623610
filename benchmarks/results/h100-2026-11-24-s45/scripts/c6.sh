export PYTHONPATH=$PWD/src
TAG=c6 python3 -u .gpu/fwd_k1_sweep.py > $OUT/sweep_c6.log 2>&1
cat $OUT/sweep_c6.log
