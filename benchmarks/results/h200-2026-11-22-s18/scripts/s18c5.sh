# Session 18, call 5: default two-partition config: GPU tier of group_norm, probe of variants, ncu stalls.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_group_norm_gpu.py > $OUT/pytest_gn.log 2>&1
echo "pytest gn rc=$?"; grep -E "passed|failed|FAILED|Error|error" $OUT/pytest_gn.log | head -20 | cut -c1-300
timeout 200 python3 .gpu/s18_gn_probe3.py > $OUT/gn_probe3.log 2>&1
echo "probe rc=$?"; cut -c1-420 $OUT/gn_probe3.log | tail -12
sed -n '/^M=/,/^PY$/p' .gpu/s18c3.sh > /tmp/ncu_part.sh
bash /tmp/ncu_part.sh 2>&1 | grep -A1 hopper
timeout 200 ncu --clock-control none --kernel-name regex:hopper --launch-count 1 --launch-skip 0 --section SourceCounters --section WarpStateStats -f -o $OUT/gn_src python3 .gpu/s18_ncu_probe.py > $OUT/ncu_src.log 2>&1
echo "ncu src rc=$?"
timeout 100 ncu --import $OUT/gn_src.ncu-rep --page source --csv --print-source sass > $OUT/gn_src_sass.csv 2> $OUT/gn_src_sass.err
echo "import rc=$?"
