export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 .gpu/gn_plans.py 2>&1 | grep -v Warn | tee $OUT/gn_plans.log
