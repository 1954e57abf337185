#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): issue #20's end-to-end table, side by side for each
# value of one backend switch. For each value in LT_VALUES of the variable LT_VAR (default
# DSV4_MOE_TILED, values "0 1"): serve slice3 on the GPU worker (synthetic weights in the
# released formats, bf16, prefix cache off, the default step budget), then `loadgen` over
# loopback with 1k-token prompts and 128 tokens out at concurrency 1, 16 and 64 (LT_REQUESTS
# requests, default 128) and 256 (4 x LT_REQUESTS). The node's precision is LT_PRECISION (default
# bf16; LT_VAR=LT_PRECISION LT_VALUES="bf16 fp8" compares precisions), its step budget
# LT_MAX_BATCHED_TOKENS (default: serve's; LT_VAR=LT_MAX_BATCHED_TOKENS compares budgets). Log:
# $OUT/loadgen_table.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
. scripts/device/serve_lib.sh
CFG=${LT_CONFIG:-tests/data/configs/dsv4-flash-slice3.json}
VAR=${LT_VAR:-DSV4_MOE_TILED}
N=${LT_REQUESTS:-128}
run() {
  local rc=0
  for value in ${LT_VALUES:-0 1}; do
    echo "== $VAR=$value"
    export "$VAR=$value"
    start_node --device cuda --synthetic-config "$CFG" \
      --tokenizer tests/data/tok-tiny/tokenizer.json --max-model-len 2048 --max-num-seqs 256 \
      --no-enable-prefix-caching --precision "${LT_PRECISION:-bf16}" --log-level warning \
      ${LT_MAX_BATCHED_TOKENS:+--max-batched-tokens "$LT_MAX_BATCHED_TOKENS"} ||
      { rc=1; continue; }
    timeout 150 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
      --prompt-len 1024 --concurrency 1,16,64 --requests "$N" --max-tokens 128 --vocab 1000 || rc=1
    timeout 150 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
      --prompt-len 1024 --concurrency 256 --requests $((4 * N)) --max-tokens 128 --vocab 1000 || rc=1
    stop_node
    unset "$VAR"
  done
  return $rc
}
run 2>&1 | tee "$OUT/loadgen_table.log"
exit "${PIPESTATUS[0]}"
