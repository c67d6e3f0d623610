python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_modulation_gpu.py -k diffusers > $OUT/tests_c7.log 2>&1
tail -3 $OUT/tests_c7.log
