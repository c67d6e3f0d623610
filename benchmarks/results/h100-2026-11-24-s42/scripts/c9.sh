export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 150 python3 -u .gpu/gn_cl_plans.py > $OUT/gn_cl_plans.log 2>&1; echo rc=$?
grep -v Warn $OUT/gn_cl_plans.log
