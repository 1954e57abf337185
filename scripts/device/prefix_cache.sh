#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): prefix caching measured on slice3 (synthetic weights in
# the released formats). For the cache on and off in turns: `dsv4-node serve` on the GPU worker,
# then `dsv4-node loadgen` over loopback: identical 8k and 32k prompts one at a time (ttft_cold is
# the first, prefilled; ttft_p50 the repeats, hits), and a multi-turn workload on a shared 2k
# prefix (4 turns a conversation) at PC_CONC concurrency. Log: $OUT/prefix_cache.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
. scripts/device/serve_lib.sh
CFG=${PC_CONFIG:-tests/data/configs/dsv4-flash-slice3.json}
run() {
  local rc=0
  for cache in on off; do
    local flag=--enable-prefix-caching
    [ "$cache" = off ] && flag=--no-enable-prefix-caching
    echo "== prefix cache $cache"
    start_node --device "${PC_DEVICE:-cuda}" --synthetic-config "$CFG" \
      --tokenizer tests/data/tok-tiny/tokenizer.json --max-model-len 40960 --max-num-seqs 16 \
      --prefix-cache-max-blocks "${PC_BLOCKS:-1024}" $flag --log-level warning || { rc=1; continue; }
    for len in 8192 32768; do
      timeout 240 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
        --shared-prefix-len $len --prompt-len 0 --concurrency 1 --requests "${PC_REPEATS:-4}" \
        --max-tokens 8 --vocab 1000 || rc=1
    done
    timeout 240 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
      --shared-prefix-len 2048 --prompt-len 256 --turns 4 --concurrency "${PC_CONC:-8,16}" \
      --requests 64 --max-tokens 64 --vocab 1000 || rc=1
    curl -s "127.0.0.1:$NODE_METRICS/metrics" | grep -E '^dsv4_prefix_cache|^dsv4_preemptions_total' || true
    stop_node
  done
  return $rc
}
run 2>&1 | tee "$OUT/prefix_cache.log"
exit "${PIPESTATUS[0]}"
