# Session 29, call 2: PINGPONG beside the table; ncu launch stats / speed of light / warp states, flashfuse vs cuDNN at hd64 causal S = 1024
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s29/scripts
timeout 240 python3 $S/s29_pp.py > $OUT/s29_pp.log 2>&1; echo "pp rc=$?"
grep -v Warn $OUT/s29_pp.log | tail -7
timeout 200 ncu --clock-control none --kernel-name regex:"fwd_hopper|cudnn|sdpa|fmha|flash|sm90" --launch-skip 2 --launch-count 8 \
  --section LaunchStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
  python3 $S/s29_ncu_probe.py > $OUT/ncu.txt 2> $OUT/ncu.err; echo "ncu rc=$?"
grep -E "^  [a-zA-Z_]|Duration|Grid Size|Block Size|Registers Per|Dynamic Shared|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued" $OUT/ncu.txt | cut -c1-160 | head -80
