#!/bin/bash
# On the H200 host: 1000 concurrent SSE streams (POST /v1/completions, 64-token prompts, 32 out)
# against `serve` on the GPU (the Flash slice), three times, with the node's threads sampled meanwhile and
# loadgen printing its first error, if any.
set -uo pipefail
B="bash .gpu/bundle/run.sh node/dsv4-node"
T=$(mktemp -d)
$B serve --synthetic-config tests/data/configs/dsv4-flash-slice3.json \
  --tokenizer models/dsv4-tiny/tokenizer.json --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --http-listen 127.0.0.1:0 --port-file "$T/ports" --max-model-len 2048 --max-num-seqs 256 \
  --max-waiting 2048 --max-requests-per-client 4096 --http-max-connections 8192 \
  >"$T/serve.log" 2>&1 &
PID=$!
for _ in $(seq 900); do grep -q '"grpc": [1-9]' "$T/ports" 2>/dev/null && break; sleep 0.2; done
H=$(sed -E 's/.*"http": ([0-9]+).*/\1/' "$T/ports")
NODE=$(pgrep -f "dsv4-node serve --synthetic-config" | head -1)
for round in 1 2 3; do
  ( for _ in $(seq 200); do awk '/^Threads/ {print $2}' /proc/$NODE/status; sleep 0.1; done ) > "$T/threads" &
  SAMPLER=$!
  echo "== round $round"
  $B loadgen --http 127.0.0.1:$H --concurrency 1000 --requests 1000 --prompt-len 64 --max-tokens 32 \
    --vocab 129280 2>&1 | tail -2
  kill $SAMPLER 2>/dev/null
  echo "node threads: min $(sort -n "$T/threads" | head -1) max $(sort -n "$T/threads" | tail -1)"
done
kill -TERM $PID; wait $PID; echo "serve rc=$?"
