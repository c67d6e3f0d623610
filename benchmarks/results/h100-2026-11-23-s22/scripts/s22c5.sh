# Session 22, call 6: the Gluon forward with FA3's ping-pong between consumer warpgroups (variant .gpu/v_pp.py) vs main.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cat .gpu/COMMIT
cp .gpu/v_pp.py src/flashfuse/ops/attention/_v_pp.py
timeout 300 python3 .gpu/s22_pingpong.py 2>&1 | tee $OUT/pingpong.log | grep -v Warn
