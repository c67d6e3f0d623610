export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -u .gpu/gelu_probe.py > $OUT/gelu_probe.log 2>&1; cat $OUT/gelu_probe.log
python3 -u .gpu/attn_short.py > $OUT/attn_short.log 2>&1; cat $OUT/attn_short.log
