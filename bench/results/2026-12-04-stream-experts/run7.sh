#!/bin/bash
# On the H200 host (one call): the warp stall reasons of the streaming gate_up kernel of a 1k
# prefill (Nsight Compute's per-reason stall metrics, per issued instruction). Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=""
for r in long_scoreboard short_scoreboard barrier mio_throttle lg_throttle math_pipe_throttle wait not_selected selected dispatch_stall no_instruction branch_resolving tex_throttle imc_miss drain membar sleeping misc; do
  M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
M="${M#,},smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_op_ldgsts.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
timeout 120 "$NCU" --clock-control none --kernel-name regex:ExpertStream --launch-count 2 --metrics "$M" \
  $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto \
  --batches 1 --contexts 0 --decode-steps 2 --precision fp8 --prompt-len 1024 --repeats 1 > "$OUT/ncu_stalls.txt" 2>&1
echo "ncu rc=$?"
grep -E "ExpertStream|stalled|inst_executed|hmma|bank_conflicts" "$OUT/ncu_stalls.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -60
