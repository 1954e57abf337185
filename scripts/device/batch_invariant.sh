#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): what --batch-invariant costs. `dsv4-node serve` on the
# GPU worker (slice3, synthetic weights in the released formats, bf16) in its default mode and with
# --batch-invariant in turns, then `dsv4-node loadgen` over loopback: 1k-token prompts, 64 tokens
# out, greedy, at BI_CONC concurrency. Log: $OUT/batch_invariant.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
CFG=${BI_CONFIG:-tests/data/configs/dsv4-flash-slice3.json}
run() {
  local rc=0
  for mode in default invariant; do
    local flag=""
    [ "$mode" = invariant ] && flag=--batch-invariant
    echo "== mode $mode"
    rm -f "$OUT/port.json"
    bash $B/run.sh node/dsv4-node serve --device cuda --synthetic-config "$CFG" \
      --tokenizer tests/data/tok-tiny/tokenizer.json --listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --port-file "$OUT/port.json" --max-model-len 4096 \
      --max-num-seqs 64 $flag --log-level warning &
    local pid=$!
    for _ in $(seq 1800); do
      kill -0 $pid 2>/dev/null || break
      python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["grpc"] <= 0)' "$OUT/port.json" 2>/dev/null && break
      sleep 0.1
    done
    local port
    port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"])' "$OUT/port.json") || { rc=1; kill $pid; wait $pid; continue; }
    timeout 300 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$port" \
      --prompt-len 1024 --concurrency "${BI_CONC:-1,16}" --requests "${BI_REQUESTS:-32}" \
      --max-tokens 64 --vocab 1000 || rc=1
    kill -TERM $pid; wait $pid
  done
  return $rc
}
run 2>&1 | tee "$OUT/batch_invariant.log"
exit "${PIPESTATUS[0]}"
