#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): prefix caching measured on slice3 (synthetic weights in
# the released formats). For the cache on and off in turns: `dsv4-node serve` on the GPU worker,
# then `dsv4-node loadgen` over loopback: identical 8k and 32k prompts one at a time (ttft_cold is
# the first, prefilled; ttft_p50 the repeats, hits), and a multi-turn workload on a shared 2k
# prefix (4 turns a conversation) at PC_CONC concurrency. Log: $OUT/prefix_cache.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
CFG=${PC_CONFIG:-tests/data/configs/dsv4-flash-slice3.json}
run() {
  local rc=0
  for cache in on off; do
    local flag=--enable-prefix-caching
    [ "$cache" = off ] && flag=--no-enable-prefix-caching
    echo "== prefix cache $cache"
    rm -f "$OUT/port.json"
    bash $B/run.sh node/dsv4-node serve --device "${PC_DEVICE:-cuda}" --synthetic-config "$CFG" \
      --tokenizer tests/data/tok-tiny/tokenizer.json --listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --port-file "$OUT/port.json" --max-model-len 40960 \
      --max-num-seqs 16 --prefix-cache-max-blocks "${PC_BLOCKS:-1024}" $flag --log-level warning &
    local pid=$!
    for _ in $(seq 1800); do
      kill -0 $pid 2>/dev/null || break
      python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["grpc"] <= 0)' "$OUT/port.json" 2>/dev/null && break
      sleep 0.1
    done
    local port metrics
    port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"])' "$OUT/port.json") || { rc=1; kill $pid; wait $pid; continue; }
    metrics=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metrics"])' "$OUT/port.json")
    for len in 8192 32768; do
      timeout 240 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$port" \
        --shared-prefix-len $len --prompt-len 0 --concurrency 1 --requests "${PC_REPEATS:-4}" \
        --max-tokens 8 --vocab 1000 || rc=1
    done
    timeout 240 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$port" \
      --shared-prefix-len 2048 --prompt-len 256 --turns 4 --concurrency "${PC_CONC:-8,16}" \
      --requests 64 --max-tokens 64 --vocab 1000 || rc=1
    curl -s "127.0.0.1:$metrics/metrics" | grep -E '^dsv4_prefix_cache|^dsv4_preemptions_total' || true
    kill -TERM $pid; wait $pid
  done
  return $rc
}
run 2>&1 | tee "$OUT/prefix_cache.log"
exit "${PIPESTATUS[0]}"
