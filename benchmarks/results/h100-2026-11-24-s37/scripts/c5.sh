export PYTHONPATH=$PWD/src
python .gpu/ab_cl.py 2>&1 | tee $OUT/ab_cl.log
python .gpu/s37_cl_trace.py 2>&1 | grep -v "round .* part [1]" | tee $OUT/cl_trace_new.log
rm -f src/flashfuse/ops/group_norm_details/_hopper_fwd_cl_old.py src/flashfuse/ops/group_norm_details/_hopper_fwd_cl_trace.py
python -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py 2>&1 | tail -3 | tee $OUT/gn_gpu.log
