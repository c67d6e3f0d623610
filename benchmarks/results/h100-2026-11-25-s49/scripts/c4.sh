export PYTHONPATH=$PWD/src
python3 -m flashfuse.cli bench attention --only deterministic --rounds 3 --out $OUT/bench_det --no-progress > $OUT/bench_c4.log 2>&1
tail -20 $OUT/bench_c4.log
