python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src || exit
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 -u .gpu/attn256.py > $OUT/attn256.log 2>&1
cat $OUT/attn256.log
python3 -u .gpu/dit47.py > $OUT/dit47.log 2>&1
cat $OUT/dit47.log | tail -150
