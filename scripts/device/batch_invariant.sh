#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): what --batch-invariant costs. `dsv4-node serve` on the
# GPU worker (slice3, synthetic weights in the released formats, bf16) in its default mode and with
# --batch-invariant in turns, then `dsv4-node loadgen` over loopback: 1k-token prompts, 64 tokens
# out, greedy, at BI_CONC concurrency. Log: $OUT/batch_invariant.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
. scripts/device/serve_lib.sh
CFG=${BI_CONFIG:-tests/data/configs/dsv4-flash-slice3.json}
run() {
  local rc=0
  for mode in default invariant; do
    local flag=""
    [ "$mode" = invariant ] && flag=--batch-invariant
    echo "== mode $mode"
    start_node --device cuda --synthetic-config "$CFG" \
      --tokenizer tests/data/tok-tiny/tokenizer.json --max-model-len 4096 --max-num-seqs 64 $flag \
      --log-level warning || { rc=1; continue; }
    timeout 300 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
      --prompt-len 1024 --concurrency "${BI_CONC:-1,16}" --requests "${BI_REQUESTS:-32}" \
      --max-tokens 64 --vocab 1000 || rc=1
    stop_node
  done
  return $rc
}
run 2>&1 | tee "$OUT/batch_invariant.log"
exit "${PIPESTATUS[0]}"
