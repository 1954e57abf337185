#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): the CUDA-graph benchmark of docs/cuda-graphs.md, all in
# one run so the figures are side by side. For each mode (none, piecewise, full_and_piecewise):
# decode step time at batch 1, 8, 64, 256 (context 4096) and TTFT (a batch-1 prefill, best of 3
# so the capture is excluded) at 1k and 8k prompts, on dsv4-flash-slice3 and on dsv4-flash cut to
# 9 layers (as many as fit one H200 in bf16 with room for the pools); the piecewise TTFT with the
# whole attention block eager (wide) against the narrow region; transformers on slice3 last.
# GB_SLICE3_ONLY=1 stops after slice3 (no transformers, no Flash-9).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
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
DECODE_SIZES=1,2,4,8,16,24,32,48,64,96,128,192,256
MODES=none,piecewise,full_and_piecewise
bench() { timeout 200 bash $B/run.sh node/dsv4-node bench --device cuda --weight-format "${WEIGHT_FORMAT:-bf16}" --log-level warning "$@"; }
rc=0
{
  echo "== dsv4-flash-slice3 decode, context 4096"
  bench --synthetic-config "$S3" --batches 1,8,64,256 --contexts 4096 --decode-steps 16 \
    --cudagraph-mode $MODES --cudagraph-capture-sizes $DECODE_SIZES || rc=1
  for p in 1024 8192; do
    echo "== dsv4-flash-slice3 TTFT, prompt $p (batch 1, best of 3: replays, not the capture)"
    bench --synthetic-config "$S3" --batches 1 --contexts 0 --prompt-len $p --decode-steps 2 \
      --repeats 3 --cudagraph-mode $MODES --cudagraph-capture-sizes $DECODE_SIZES,1024,8192 || rc=1
    echo "== dsv4-flash-slice3 TTFT, prompt $p, piecewise with the whole attention block eager (wide)"
    DSV4_PIECEWISE_EAGER_REGION=wide bench --synthetic-config "$S3" --batches 1 --contexts 0 \
      --prompt-len $p --decode-steps 2 --repeats 3 --cudagraph-mode piecewise \
      --cudagraph-capture-sizes $DECODE_SIZES,1024,8192 || rc=1
  done
} 2>&1 | tee "$OUT/graph_bench.log"
[ "${GB_SLICE3_ONLY:-0}" = 1 ] && exit $rc
# transformers on slice3, the same session (its step time varies between sessions)
timeout 200 python3 bench/hf_decode_bench.py "$S3" --batches 1,8 --prompt-len 1024 --steps 16 2>&1 |
  tee "$OUT/hf.log" || rc=1
{
  echo "== dsv4-flash cut to 9 layers: decode, context 4096"
  bench --synthetic-config "$F9" --batches 1,8,64,256 --contexts 4096 --decode-steps 8 \
    --cudagraph-mode $MODES --cudagraph-capture-sizes $DECODE_SIZES || rc=1
  echo "== dsv4-flash cut to 9 layers: TTFT, prompt 1024"
  bench --synthetic-config "$F9" --batches 1 --contexts 0 --prompt-len 1024 --decode-steps 2 \
    --repeats 3 --cudagraph-mode $MODES --cudagraph-capture-sizes $DECODE_SIZES,1024 || rc=1
} 2>&1 | tee "$OUT/graph_bench_flash9.log"
exit $rc
