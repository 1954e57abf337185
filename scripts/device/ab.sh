#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): a side-by-side of one environment switch. For each
# value of $AB_VAR in $AB_VALUES (space-separated; "-" leaves the variable unset), slice3 at context
# 4096, batches ${AB_BATCHES:-1,8}, eager and FULL graphs; the values are run in turn
# ${AB_ROUNDS:-2} times so the run-to-run spread shows next to the differences. Log: $OUT/ab.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
: "${AB_VAR:?name the switch}" "${AB_VALUES:?list its values}"
ab() {
  local rc=0
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for v in $AB_VALUES; do
      echo "== round $round: $AB_VAR=$v"
      if [ "$v" = "-" ]; then unset "$AB_VAR"; else export "$AB_VAR=$v"; fi
      timeout 90 bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --log-level warning \
        --synthetic-config "$S3" --batches "${AB_BATCHES:-1,8}" --contexts 4096 \
        --decode-steps 16 --cudagraph-mode none,full_and_piecewise \
        --cudagraph-capture-sizes 1,2,4,8 2>&1 | grep -vE "^(W|I)[0-9]{4} " || rc=1
    done
  done
  return $rc
}
# (The loop runs in the pipeline's subshell: its status, not a variable, carries a failure out.)
ab 2>&1 | tee "$OUT/ab.log"
exit "${PIPESTATUS[0]}"
