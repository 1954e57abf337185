#!/bin/bash
# On the H200 host: the OpenAI HTTP API against gRPC on one node and one load. `serve` runs the
# synthetic DeepSeek-V4-Flash 3-layer slice on the GPU with both APIs; `loadgen` (1k-token
# prompts, 128 tokens out, greedy, ignore_eos) streams gRPC Generate and POST /v1/completions
# (return_token_ids: one event per engine chunk, as on gRPC) in turn at each concurrency, gRPC
# again after HTTP to show drift. Then 1000 concurrent SSE streams (64-token prompts, 32 out) with
# the node's thread count sampled while they are open.
#   OUT=dir bash http_vs_grpc.sh   (from the repository root, with the bundle in .gpu/bundle)
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B="bash .gpu/bundle/run.sh node/dsv4-node"
T=$(mktemp -d)
$B serve --synthetic-config tests/data/configs/dsv4-flash-slice3.json \
  --tokenizer models/dsv4-tiny/tokenizer.json --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --http-listen 127.0.0.1:0 --port-file "$T/ports" --max-model-len 2048 --max-num-seqs 256 \
  --max-waiting 2048 --max-requests-per-client 4096 --http-max-connections 8192 \
  >"$OUT/serve.log" 2>&1 &
PID=$!
for _ in $(seq 900); do grep -q '"grpc": [1-9]' "$T/ports" 2>/dev/null && break; sleep 0.2; done
G=$(sed -E 's/.*"grpc": ([0-9]+).*/\1/' "$T/ports"); H=$(sed -E 's/.*"http": ([0-9]+).*/\1/' "$T/ports")
M=$(sed -E 's/.*"metrics": ([0-9]+).*/\1/' "$T/ports")
NODE=$(pgrep -f "dsv4-node serve --synthetic-config" | head -1)
echo "node pid $NODE threads at rest: $(awk '/^Threads/ {print $2}' /proc/$NODE/status)"
for c in 1 16 64 256; do
  for api in grpc http grpc; do
    if [ $api = grpc ]; then where="--target 127.0.0.1:$G"; else where="--http 127.0.0.1:$H"; fi
    echo "== $api c=$c"
    $B loadgen $where --concurrency $c --prompt-len 1024 --max-tokens 128 --vocab 129280 2>&1 | tail -1
  done
done
echo "== 1000 concurrent SSE streams"
( for _ in $(seq 120); do awk '/^Threads/ {print $2}' /proc/$NODE/status; sleep 0.25; done ) > "$T/threads" &
SAMPLER=$!
$B loadgen --http 127.0.0.1:$H --concurrency 1000 --requests 1000 --prompt-len 64 --max-tokens 32 \
  --vocab 129280 2>&1 | tail -2
kill $SAMPLER 2>/dev/null
echo "node threads during the 1000 streams: min $(sort -n "$T/threads" | head -1) max $(sort -n "$T/threads" | tail -1)"
curl -s "127.0.0.1:$M/metrics" | grep -E '^dsv4_http_responses_total|^dsv4_requests_finished_total' | head -20
kill -TERM $PID; wait $PID; echo "serve rc=$?"
grep -E "event=(serving|listening)" "$OUT/serve.log" | cut -c1-300
