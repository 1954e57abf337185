#!/usr/bin/env bash
# The final tree on the H200 (the plan's graph-step term and the kernel header split): the whole
# GPU suite, and the memory plan on Flash-37 with 64 x 8k of state: the default
# capture sizes (prefill chunks of up to 512 tokens run piecewise: refused, naming the sizes)
# against capture sizes up to 64 (loads; decode and a 2048-token step run).
set -uo pipefail
[ -d .gpu/bundle ] || tar -C .gpu -xJf .gpu/pack/bundle.tar.xz
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
B=.gpu/bundle
SECONDS=0
timeout 400 bash $B/run.sh tests/dsv4_gpu_tests > "$OUT/gpu_tests.log" 2>&1
grep -E "FAILED|PASSED|tests? from .* ran" "$OUT/gpu_tests.log" | tail -6
echo "at ${SECONDS}s"
python3 - <<'PY'
import json
c = json.load(open("tests/data/configs/dsv4-flash.json")); n = 37
c["num_hidden_layers"] = n; c["layer_types"] = c["layer_types"][:n]; c["mlp_layer_types"] = c["mlp_layer_types"][:n]
json.dump(c, open("/tmp/f37.json", "w"), indent=1)
PY
f37() {
  timeout 150 bash $B/run.sh node/dsv4-node bench --device cuda --log-level info \
    --synthetic-config /tmp/f37.json --weight-format auto --batches 1,64 --contexts 8000,0 \
    --prompt-len 32 --decode-steps 8 --cudagraph-mode full_and_piecewise "$@" 2>&1 |
    grep -E "^ +[0-9]+ +[0-9]+ |memory_plan|scratch high water|error" | cut -c1-500
}
echo "== Flash-37, 64 x 8k, capture sizes 1..2048 (the 64 x 32 prefill step would run piecewise)"
f37 --cudagraph-capture-sizes 1,2,4,8,16,32,64,128,256,512,1024,2048
echo "== Flash-37, 64 x 8k, capture sizes up to 64"
f37 --cudagraph-capture-sizes 1,2,4,8,16,32,64
echo "done at ${SECONDS}s"
