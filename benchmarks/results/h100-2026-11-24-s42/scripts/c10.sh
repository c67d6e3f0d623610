export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 200 python3 -u .gpu/gn_bwd_plans.py > $OUT/gn_bwd_plans.log 2>&1; echo rc=$?
grep -v Warn $OUT/gn_bwd_plans.log
