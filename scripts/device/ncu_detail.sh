#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): Nsight Compute's detail sections (speed of light, memory
# workload, occupancy, warp states, scheduler, launch) for every kernel of one eager batch-1
# decode step of slice3 at context 4096, as CSV ($OUT/ncu_detail.csv); clocks and caches left
# alone as in ncu_step.sh. For finding why a weight-streaming kernel stays under the HBM rate.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 400 "$NCU" --clock-control none --cache-control none --csv --page details \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --launch-skip "${NCU_SKIP:-700}" --launch-count "${NCU_COUNT:-120}" \
  bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --log-level warning --synthetic-config "$S3" \
  --batches 1 --contexts 4096 --decode-steps 16 --repeats 1 --cudagraph-mode none \
  > "$OUT/ncu_detail.csv" 2> "$OUT/ncu_detail.err" || { tail -5 "$OUT/ncu_detail.err"; exit 1; }
wc -l "$OUT/ncu_detail.csv"
