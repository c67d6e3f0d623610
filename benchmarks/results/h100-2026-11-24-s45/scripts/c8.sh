export PYTHONPATH=$PWD/src
python3 -m flashfuse.cli bench attention --only "hd(160|192|256) " --rounds 3 --out $OUT/bench --no-progress > $OUT/bench_c8.log 2>&1
tail -42 $OUT/bench_c8.log | cut -c1-140
