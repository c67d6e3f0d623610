export PYTHONPATH=$PWD/src
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_flash_attn_gpu.py tests/test_flash_attn_varlen_gpu.py tests/test_flash_attn_kernels_gpu.py tests/test_flash_attn_wide_gpu.py -k "dropout or deterministic" 2>&1 | tail -2 | tee $OUT/tests.log
export DIMS=128,64,80 MODES=bwd LEAN=1 SEQS=1024,2048,4096
PYTHONPATH=$PWD/.gpu/mid51/src timeout 80 python3 -u .gpu/drop_time51.py mid 2>&1 | tail -1
timeout 80 python3 -u .gpu/drop_time51.py new 2>&1 | tail -1
PYTHONPATH=$PWD/.gpu/mid51/src timeout 80 python3 -u .gpu/drop_time51.py mid2 2>&1 | tail -1
timeout 80 python3 -u .gpu/drop_time51.py new2 2>&1 | tail -1
python3 .gpu/table51.py $OUT new mid mid2 new2 | tee $OUT/table.txt
