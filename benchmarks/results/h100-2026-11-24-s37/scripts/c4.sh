export PYTHONPATH=$PWD/src
python .gpu/ab_phase.py 2>&1 | tee $OUT/ab_phase.log
python .gpu/s37_cl_trace.py src/flashfuse/ops/group_norm_details/_hopper_fwd_cl_d6000.py 2>&1 | head -12 | tee $OUT/cl_trace_d6000.log
rm -f src/flashfuse/ops/group_norm_details/_hopper_fwd_cl_d*.py src/flashfuse/ops/group_norm_details/_hopper_fwd_cl_trace.py
