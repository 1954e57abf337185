#!/usr/bin/env bash
# Flash cut to 9 layers on the final build: decode batch 1 and 256 (eager and FULL), then TTFT 1k
# with the wide expert kernel and without.
set -uo pipefail
B=.gpu/bundle
F9=$OUT/dsv4-flash-9l.json
python3 - "$F9" <<'PY'
import json, sys
c = json.load(open("tests/data/configs/dsv4-flash.json"))
n = 9
c["num_hidden_layers"] = n
c["layer_types"] = c["layer_types"][:n]
c["mlp_layer_types"] = c["mlp_layer_types"][:n]
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
bench() { timeout 100 bash $B/run.sh node/dsv4-node bench --device cuda --log-level warning "$@"; }
echo "== Flash-9 decode, context 4096"
bench --synthetic-config "$F9" --batches 1,256 --contexts 4096 --decode-steps 8 \
  --cudagraph-mode none,full_and_piecewise --cudagraph-capture-sizes 1,256 2>&1 | grep -E "^ +[0-9]|rror"
for v in 1 0; do
  echo "== Flash-9 TTFT 1k, DSV4_MOE_WIDE=$v"
  DSV4_MOE_WIDE=$v bench --synthetic-config "$F9" --batches 1 --contexts 0 --prompt-len 1024 \
    --decode-steps 2 --repeats 2 --cudagraph-mode full_and_piecewise \
    --cudagraph-capture-sizes 1,1024 2>&1 | grep -E "^ +[0-9]|rror"
done
