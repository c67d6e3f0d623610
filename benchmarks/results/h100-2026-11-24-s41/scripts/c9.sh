for r in 1 2 3; do for v in v0 v1 v2 v3; do PYTHONPATH=$PWD/.gpu/$v/src python3 .gpu/fwd_ab.py $PWD/.gpu/$v/src $v 2>&1 | tail -1 | tee -a $OUT/fwd_ab.log; done; done
