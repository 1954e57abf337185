#!/usr/bin/env bash
# On the GPU host: kernel benchmark, the slice3 decode benchmark of dsv4-node, and the transformers
# peer on the same config, one after the other in one run. Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
CFG=${CFG:-tests/data/configs/dsv4-flash-slice3.json}
rc=0
timeout 150 bash $B/run.sh bench/dsv4_gpu_kernels_bench --iters 30 2>&1 | tee "$OUT/kernels.log" || rc=1
timeout 200 bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --synthetic-config "$CFG" \
  --batches 1,8,64,256 --contexts 1024,16384,65536 --decode-steps 16 --repeats 1 \
  --log-level warning 2>&1 | tee "$OUT/slice3.log" || rc=1
timeout 200 python3 bench/hf_decode_bench.py "$CFG" --batches 1,8 --prompt-len 1024 --steps 16 2>&1 |
  tee "$OUT/hf.log" || rc=1
exit $rc
