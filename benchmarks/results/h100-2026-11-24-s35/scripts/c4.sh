export PYTHONPATH=$PWD/src
python .gpu/ab_new.py 2>&1 | grep -v Warning | tee $OUT/ab_wait.log
rm -f src/flashfuse/ops/group_norm_details/_old_*.py
