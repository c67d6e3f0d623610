export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 280 python3 -u .gpu/gn_plan_check.py > $OUT/gn_plan_check.log 2>&1; echo rc=$?
grep -v Warn $OUT/gn_plan_check.log
