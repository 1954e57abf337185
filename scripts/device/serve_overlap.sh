#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): the serving path end to end with overlapped decode off
# and on, in turns: `dsv4-node serve` on the GPU worker (the embedded tiny model, or
# SERVE_MODEL=DIR) and `dsv4-node loadgen` over loopback at concurrency ${SO_CONC:-1,8,32}
# (${SO_ROUNDS:-2} rounds; SO_DEVICE=cpu tries it here). Log: $OUT/serve_overlap.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
MODEL=${SERVE_MODEL:-tests/data/dsv4-tiny}
run() {
  local rc=0
  for round in $(seq "${SO_ROUNDS:-2}"); do
    for o in off on; do
      echo "== round $round: --overlap-steps $o"
      rm -f "$OUT/port.json"
      bash $B/run.sh node/dsv4-node serve --device "${SO_DEVICE:-cuda}" --model "$MODEL" \
        --tokenizer tests/data/tok-tiny/tokenizer.json --listen 127.0.0.1:0 \
        --metrics-listen 127.0.0.1:0 --port-file "$OUT/port.json" --overlap-steps "$o" \
        --log-level warning &
      local pid=$!
      for _ in $(seq 600); do [ -s "$OUT/port.json" ] && break; sleep 0.1; done
      local port
      port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"])' "$OUT/port.json") || { rc=1; kill $pid; wait $pid; continue; }
      timeout 120 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$port" \
        --concurrency "${SO_CONC:-1,8,32}" --prompt-len 64 --max-tokens 128 --vocab 1000 || rc=1
      kill -TERM $pid; wait $pid
    done
  done
  return $rc
}
run 2>&1 | tee "$OUT/serve_overlap.log"
exit "${PIPESTATUS[0]}"
