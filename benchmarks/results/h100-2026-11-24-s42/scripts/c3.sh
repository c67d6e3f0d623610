export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 100 > $OUT/smi.csv 2>&1 &
SMI=$!
python3 .gpu/dtype_probe.py $OUT/rows.json > $OUT/probe.log 2>&1; echo "probe rc=$?"
kill $SMI
python3 .gpu/smi_join.py $OUT/rows.json $OUT/smi.csv | tee $OUT/joined.txt
head -3 $OUT/smi.csv
