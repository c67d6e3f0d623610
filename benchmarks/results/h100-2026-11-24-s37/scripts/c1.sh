set -x
export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
python .gpu/s37_cl_trace.py 2>&1 | tee $OUT/cl_trace.log
