#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): the wide expert kernel side by side with the
# 8-tokens-at-a-time one (DSV4_MOE_WIDE=0), in turns, ${MW_ROUNDS:-2} rounds: slice3 decode at
# context 4096, batches ${MW_BATCHES:-8,64,256} in FULL graphs (full_and_piecewise) and eager, and
# TTFT at 1k and 8k prompts (batch 1, best of 3; MW_TTFT=0 skips it and the ncu part). Then Nsight Compute's time and DRAM bytes of the expert
# kernels of a few batch-256 decode steps with each value. Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SIZES=1,2,4,8,16,24,32,48,64,96,128,192,256
bench() { timeout 150 bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --log-level warning "$@"; }
rc=0
{
  for round in $(seq "${MW_ROUNDS:-2}"); do
    for v in 1 0; do
      echo "== round $round: DSV4_MOE_WIDE=$v decode, context 4096"
      DSV4_MOE_WIDE=$v bench --synthetic-config "$S3" --batches "${MW_BATCHES:-8,64,256}" --contexts 4096 \
        --decode-steps 16 --cudagraph-mode none,full_and_piecewise \
        --cudagraph-capture-sizes $SIZES || rc=1
      [ "${MW_TTFT:-1}" = 0 ] && continue
      echo "== round $round: DSV4_MOE_WIDE=$v TTFT 1k, 8k"
      for p in 1024 8192; do
        DSV4_MOE_WIDE=$v bench --synthetic-config "$S3" --batches 1 --contexts 0 --prompt-len $p \
          --decode-steps 2 --repeats 3 --cudagraph-mode full_and_piecewise \
          --cudagraph-capture-sizes $SIZES,$p || rc=1
      done
    done
  done
} 2>&1 | tee "$OUT/moe_wide.log"
[ "${MW_TTFT:-1}" = 0 ] && exit $rc
for v in 1 0; do
  DSV4_MOE_WIDE=$v timeout 150 "$NCU" --clock-control none --cache-control none \
    --kernel-name regex:Expert --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    --csv --launch-skip "${NCU_SKIP:-60}" --launch-count "${NCU_COUNT:-16}" \
    bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --log-level warning --synthetic-config "$S3" \
    --batches 256 --contexts 4096 --decode-steps 16 --repeats 1 --cudagraph-mode none \
    > "$OUT/ncu_experts_wide$v.csv" 2> "$OUT/ncu_experts_wide$v.err" || rc=1
done
exit $rc
