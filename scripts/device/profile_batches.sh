#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): where the GPU time of a large decode batch goes. The op
# profile (DSV4_PROFILE_OPS=1, eager steps, one event pair per op) of slice3 at context 4096 for
# each batch of PROFILE_BATCHES (default 64 256), then Nsight Compute's time and DRAM bytes of the
# routed-expert kernels of a few decode steps at the last batch (clocks and caches left alone).
# Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
rc=0
last=1
for b in ${PROFILE_BATCHES:-64 256}; do
  DSV4_PROFILE_OPS=1 timeout 200 bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" \
    --log-level warning --synthetic-config "$S3" --batches "$b" --contexts 4096 --decode-steps 8 \
    --repeats 1 --cudagraph-mode none 2>&1 | tee "$OUT/profile_b$b.log" || rc=1
  last=$b
done
# The experts' kernels of the decode steps: the prefill's come first, so skip a generous count.
timeout 240 "$NCU" --clock-control none --cache-control none --kernel-name regex:Expert \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size --csv \
  --launch-skip "${NCU_SKIP:-60}" --launch-count "${NCU_COUNT:-12}" \
  bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --log-level warning --synthetic-config "$S3" \
  --batches "$last" --contexts 4096 --decode-steps 16 --repeats 1 --cudagraph-mode none \
  > "$OUT/ncu_experts_b$last.csv" 2> "$OUT/ncu_experts.err" || { tail -5 "$OUT/ncu_experts.err"; rc=1; }
exit $rc
