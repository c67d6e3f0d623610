python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONPATH=/tmp/site:$PWD/src
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_patch_diffusers_gpu.py tests/test_modulation_gpu.py -k "gelu or dit or modulation or ada" > $OUT/tests_c5.log 2>&1
tail -4 $OUT/tests_c5.log
python3 -u .gpu/adaln_sweep2.py > $OUT/adaln_sweep2.log 2>&1; cat $OUT/adaln_sweep2.log
