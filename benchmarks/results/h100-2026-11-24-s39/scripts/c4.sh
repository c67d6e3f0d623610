export PYTHONPATH=$PWD/src
python3 .gpu/varlen_ab2.py 2>&1 | grep -v Warn | tee $OUT/varlen_ab2.log
