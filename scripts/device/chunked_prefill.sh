#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): what the prefill chunk costs. For each step budget in
# CP_CHUNKS (`serve --max-batched-tokens`, which is the largest prefill chunk): slice3 on the GPU
# worker (synthetic weights in the released formats, bf16, prefix cache off), then `loadgen` over
# loopback: an 8k prompt alone (TTFT: one pass or 8192 / chunk chunks), and 1k prompts with 128
# tokens out at concurrency CP_CONC (decode rows sharing steps with prefill chunks: ITL p99), in
# precision CP_PRECISION (default bf16).
# Log: $OUT/chunked_prefill.log.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
. scripts/device/serve_lib.sh
CFG=${CP_CONFIG:-tests/data/configs/dsv4-flash-slice3.json}
run() {
  local rc=0
  for chunk in ${CP_CHUNKS:-512 2048 8192}; do
    echo "== --max-batched-tokens $chunk"
    start_node --device cuda --synthetic-config "$CFG" \
      --tokenizer tests/data/tok-tiny/tokenizer.json --max-model-len 9216 --max-num-seqs 64 \
      --max-batched-tokens "$chunk" --no-enable-prefix-caching --precision "${CP_PRECISION:-bf16}" \
      --log-level warning \
      || { rc=1; continue; }
    timeout 120 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
      --prompt-len 8192 --concurrency 1 --requests "${CP_REPEATS:-4}" --max-tokens 8 \
      --vocab 1000 || rc=1
    timeout 180 bash $B/run.sh node/dsv4-node loadgen --target "127.0.0.1:$NODE_PORT" \
      --prompt-len 1024 --concurrency "${CP_CONC:-16,64}" --requests 128 --max-tokens 128 \
      --vocab 1000 || rc=1
    stop_node
  done
  return $rc
}
run 2>&1 | tee "$OUT/chunked_prefill.log"
exit "${PIPESTATUS[0]}"
