#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): overlapped decode side by side with synchronous steps.
# slice3 at context 4096, batches ${OV_BATCHES:-1,8,64}, eager and FULL graphs, each step's device
# time measured (DSV4_STEP_DEVICE_TIME=1); --overlap-steps off and on alternate ${OV_ROUNDS:-2}
# times so the run-to-run spread shows next to the difference. Log: $OUT/overlap.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
run() {
  local rc=0
  for round in $(seq "${OV_ROUNDS:-2}"); do
    for o in off on; do
      echo "== round $round: --overlap-steps $o"
      DSV4_STEP_DEVICE_TIME=1 timeout 150 bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" \
        --log-level warning --synthetic-config "$S3" --batches "${OV_BATCHES:-1,8,64}" \
        --contexts 4096 --decode-steps 32 --cudagraph-mode none,full_and_piecewise \
        --cudagraph-capture-sizes 1,2,4,8,16,32,64 --overlap-steps "$o" 2>&1 |
        grep -vE "^(W|I)[0-9]{4} " || rc=1
    done
  done
  return $rc
}
run 2>&1 | tee "$OUT/overlap.log"
exit "${PIPESTATUS[0]}"
