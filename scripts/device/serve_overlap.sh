#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): the serving path end to end with overlapped decode off
# and on, in turns: `dsv4-node serve` on the GPU worker (the embedded tiny model, or
# SERVE_MODEL=DIR) and `dsv4-node loadgen` over loopback at concurrency ${SO_CONC:-1,8,32}
# (${SO_ROUNDS:-2} rounds; SO_DEVICE=cpu tries it here). Log: $OUT/serve_overlap.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
. scripts/device/serve_lib.sh
MODEL=${SERVE_MODEL:-tests/data/dsv4-tiny}
run() {
  local rc=0
  for round in $(seq "${SO_ROUNDS:-2}"); do
    for o in off on; do
      echo "== round $round: --overlap-steps $o"
      start_node --device "${SO_DEVICE:-cuda}" --model "$MODEL" \
        --tokenizer tests/data/tok-tiny/tokenizer.json --overlap-steps "$o" --log-level warning \
        || { rc=1; continue; }
      timeout 120 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
        --concurrency "${SO_CONC:-1,8,32}" --prompt-len 64 --max-tokens 128 --vocab 1000 || rc=1
      stop_node
    done
  done
  return $rc
}
run 2>&1 | tee "$OUT/serve_overlap.log"
exit "${PIPESTATUS[0]}"
