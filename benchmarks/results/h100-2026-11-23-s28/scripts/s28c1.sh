# Session 28, call 1: where the NCHW Gluon forward's time goes (variants, candidate A), ncu metrics and source stalls
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
S=benchmarks/results/h100-2026-11-23-s28/scripts
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
timeout 240 python3 $S/s28_fwd_breakdown.py _cand_a > $OUT/breakdown.log 2>&1; echo "breakdown rc=$?"
grep -v Warn $OUT/breakdown.log | cut -c1-400 | tail -8
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
for s in long_scoreboard barrier membar lg_throttle drain wait math_pipe_throttle mio_throttle short_scoreboard no_instruction not_selected selected dispatch_stall branch_resolving sleeping; do
  M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
for mod in _hopper_fwd _cand_a; do
sed -i "s/_hopper_fwd as hopper_fwd$/$mod as hopper_fwd/;s/_cand_a as hopper_fwd$/$mod as hopper_fwd/" src/flashfuse/ops/group_norm.py
timeout 100 ncu --clock-control none --print-summary none --csv --kernel-name regex:"fwd_hopper" --launch-skip 2 --launch-count 1 --metrics $M python3 $S/s28_ncu_probe.py > $OUT/ncu_$mod.csv 2> $OUT/ncu_$mod.err
echo "ncu $mod rc=$?"
python3 $S/s28_ncu_table.py $OUT/ncu_$mod.csv
done
sed -i "s/_cand_a as hopper_fwd$/_hopper_fwd as hopper_fwd/" src/flashfuse/ops/group_norm.py
timeout 150 ncu --clock-control none --kernel-name regex:fwd_hopper --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats -f -o $OUT/gn_src python3 $S/s28_ncu_probe.py > $OUT/ncu_src.log 2>&1
echo "ncu src rc=$?"
timeout 100 ncu --import $OUT/gn_src.ncu-rep --page source --csv --print-source sass > $OUT/gn_src_sass.csv 2> $OUT/gn_src_sass.err
echo "import rc=$?"; rm -f $OUT/gn_src.ncu-rep
