# Session 21, call 2: the proxy-fence fix: whole GN GPU tier, then the CL probe (Gluon vs Triton plans vs clone) bf16 + fp16
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest gn rc=$?"; grep -E "passed|failed|FAILED" $OUT/pytest_gn.log | tail -8 | cut -c1-300
timeout 150 python3 .gpu/s20_cl_probe.py > $OUT/cl_probe_bf16.log 2>&1; echo "probe rc=$?"; mv $OUT/cl_probe.json $OUT/cl_probe_bf16.json
DT=fp16 timeout 150 python3 .gpu/s20_cl_probe.py > $OUT/cl_probe_fp16.log 2>&1; echo "probe rc=$?"; mv $OUT/cl_probe.json $OUT/cl_probe_fp16.json
cut -c1-175 $OUT/cl_probe_bf16.log $OUT/cl_probe_fp16.log | grep -v Warn
