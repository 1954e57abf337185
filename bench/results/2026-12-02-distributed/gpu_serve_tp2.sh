#!/bin/bash
# On the H200 host: the same greedy request against `serve` on the GPU worker (TP1) and against a
# TP2 node whose two ranks share the GPU (data plane: host-staged Gloo), both fp32.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B="bash .gpu/bundle/run.sh node/dsv4-node"
T=$(mktemp -d)
for tp in 1 2; do
  $B serve --precision fp32 --tensor-parallel-size $tp --listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --port-file "$T/p$tp" --max-model-len 1024 >"$OUT/serve_tp$tp.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do grep -q '"grpc": [1-9]' "$T/p$tp" 2>/dev/null && break; sleep 0.2; done
  port=$(sed -E 's/.*"grpc": ([0-9]+).*/\1/' "$T/p$tp")
  echo "== TP$tp"
  $B client --target 127.0.0.1:$port --prompt-ids 3,17,29,5,11,40,2,9 --max-tokens 24 --ignore-eos --json 2>&1 |
    python3 -c "import sys,json
toks=[]
for l in sys.stdin:
  try: m=json.loads(l)
  except Exception: continue
  toks+=m.get('chunk',{}).get('token_ids',[])
  if 'finished' in m: print('finished', m['finished'].get('finish_reason'))
print('tokens', toks)"
  grep -E "event=(data_plane|worker_registered|worker_configured)" "$OUT/serve_tp$tp.log" | cut -c1-220
  kill -TERM $pid; wait $pid
done
