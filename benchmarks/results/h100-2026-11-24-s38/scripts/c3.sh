export DIMS=160,256 SEQS=2048,4096 NAMES=gluon
for round in 1 2; do
for v in commit none deferred; do
  if [ $v = deferred ]; then export PYTHONPATH=$PWD/src; else export PYTHONPATH=$PWD/.gpu/v_$v/src; fi
  echo "== $v round $round"
  TAG=c3_$v python3 .gpu/wide.py 2>&1 | tee -a $OUT/c3_$v.log
done
done
