#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): Nsight Compute per-kernel times of eager batch-1 decode
# steps of slice3 at context 4096, then the table of one step (bench/ncu_step_table.py). Clocks
# and caches are left alone (--clock-control none --cache-control none): with ncu's default cache
# flush, a small kernel that reads what the previous one wrote looks several times slower than it
# is. Kernels run serialised (no PDL or side-stream overlap). Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# The prefill and the first decode steps come first; 780 launches in, a step begins.
timeout 300 "$NCU" --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
  --launch-skip "${NCU_SKIP:-700}" --launch-count "${NCU_COUNT:-200}" \
  bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --log-level warning --synthetic-config "$S3" \
  --batches 1 --contexts 4096 --decode-steps 16 --repeats 1 --cudagraph-mode none \
  > "$OUT/ncu.csv" 2> "$OUT/ncu.err" || { tail -5 "$OUT/ncu.err"; exit 1; }
python3 bench/ncu_step_table.py "$OUT/ncu.csv" | tee "$OUT/ncu_step.txt"
