python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests
python3 -u .gpu/emb_probe.py > $OUT/emb_probe.log 2>&1; cat $OUT/emb_probe.log
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_embeddings_gpu.py tests/test_patch_diffusers_gpu.py tests/test_modulation_gpu.py > $OUT/tests_c6.log 2>&1
tail -4 $OUT/tests_c6.log
python3 -u .gpu/dit_graph.py new > $OUT/dit_new.log 2>&1; cat $OUT/dit_new.log
python3 -m flashfuse.cli bench models --only "dit-xl-2" --providers flashfuse-graph,hf-eager,hf-compile-graphs --rounds 3 --out $OUT/bench_models --no-progress --no-plots > $OUT/bench_models.log 2>&1
tail -8 $OUT/bench_models.log
