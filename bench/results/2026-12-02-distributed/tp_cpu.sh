#!/bin/bash
# TP1 against TP2 (and TP4) on the CPU: the same loadgen against a node serving dsv4-tiny in
# this process, then split over 2 (4) `dsv4-node worker` processes on Gloo.
# Usage: tp_cpu.sh BUILD   (or NODE="bash .gpu/bundle/run.sh node/dsv4-node" tp_cpu.sh)
set -euo pipefail
B=${NODE:-${1:-build}/node/dsv4-node}
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT
for tp in 1 2 4; do
  $B serve --device cpu --threads 1 --tensor-parallel-size $tp --listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --port-file "$T/p$tp" --max-num-seqs 16 >"$T/log$tp" 2>&1 &
  for _ in $(seq 100); do [ -s "$T/p$tp" ] && grep -q '"grpc": [1-9]' "$T/p$tp" && break; sleep 0.2; done
  port=$(python3 -c "import json;print(json.load(open('$T/p$tp'))['grpc'])")
  echo "== TP$tp"
  $B loadgen --target 127.0.0.1:$port --concurrency 1 8 --requests 16 --prompt-len 64 \
    --max-tokens 32 --vocab 1024
  kill %1; wait %1 2>/dev/null || true
done
