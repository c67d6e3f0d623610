python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONPATH=/tmp/site:$PWD/src
timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_kernels_gpu.py tests/test_patch_diffusers_gpu.py tests/test_modulation_gpu.py -k "short or table or gelu or dit or modulation or ada or patched" > $OUT/tests_c3.log 2>&1
tail -8 $OUT/tests_c3.log
PYTHONPATH=/tmp/site:$PWD/.gpu/base/src python3 -u .gpu/dit_graph.py base > $OUT/dit_base.log 2>&1; cat $OUT/dit_base.log
python3 -u .gpu/dit_graph.py new > $OUT/dit_new.log 2>&1; cat $OUT/dit_new.log
python3 -u .gpu/adaln_sweep.py > $OUT/adaln_sweep.log 2>&1; cat $OUT/adaln_sweep.log
