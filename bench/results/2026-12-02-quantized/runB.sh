#!/usr/bin/env bash
# Issue #19 on the H200 after the kernel variants were settled (FP8 GEMV and MXFP4 decode:
# variant 1 of runA) and a layer's scratch goes to the next in large eager steps:
#   runB.sh tests   the whole GPU suite (quantised synthetic models) and the graph suite dense
#   runB.sh bench   kernels; slice3 and Flash-9 auto vs bf16 (decode, TTFT); then as "flash"
#   runB.sh flash   Flash-37 with
#                   64 x 8k of state (decode, a 2048-token prefill step, TTFT 1k/8k with the
#                   scratch high water against the plan); the largest cut that loads
set -uo pipefail
PART=${1:-tests}
[ -d .gpu/bundle ] || tar -C .gpu -xJf .gpu/pack/bundle.tar.xz
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
B=.gpu/bundle
S3=tests/data/configs/dsv4-flash-slice3.json
flash_cut() {  # flash_cut N FILE: dsv4-flash.json cut to N layers
  python3 - "$1" "$2" <<'PY'
import json, sys
n = int(sys.argv[1]); c = json.load(open("tests/data/configs/dsv4-flash.json"))
c["num_hidden_layers"] = n; c["layer_types"] = c["layer_types"][:n]; c["mlp_layer_types"] = c["mlp_layer_types"][:n]
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
SECONDS=0
if [ "$PART" = tests ]; then
  timeout 450 bash $B/run.sh tests/dsv4_gpu_tests > "$OUT/gpu_tests.log" 2>&1
  grep -E "FAILED|PASSED|SKIPPED \]|tests? from .* ran" "$OUT/gpu_tests.log" | tail -12
  echo "at ${SECONDS}s"
  DSV4_TEST_WEIGHT_FORMAT=bf16 timeout 100 bash $B/run.sh tests/dsv4_gpu_tests \
    --gtest_filter='CudaGraphs.*' > "$OUT/gpu_tests_dense.log" 2>&1
  grep -E "FAILED|PASSED" "$OUT/gpu_tests_dense.log" | tail -3
  echo "at ${SECONDS}s"
  exit 0
fi
bench() { timeout 120 bash $B/run.sh node/dsv4-node bench --device cuda --log-level warning "$@"; }
binfo() { timeout 120 bash $B/run.sh node/dsv4-node bench --device cuda --log-level info "$@"; }
rows() { grep -E "^ +[0-9]+ +[0-9]+ |error|scratch high water|memory_plan|does not fit" | cut -c1-420; }
if [ "$PART" = bench ]; then
timeout 60 bash $B/run.sh bench/dsv4_gpu_kernels_bench --fp8-only --warmup-ms 20 --iters 500 > "$OUT/kernels_fp8.log" 2>&1
timeout 60 bash $B/run.sh bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 200 > "$OUT/kernels_moe_quant.log" 2>&1
grep -E "\[fp8\]|mxfp4" "$OUT/kernels_fp8.log" "$OUT/kernels_moe_quant.log" | awk '{print $1,$2,$3,$4,$5,$6}'
echo "kernels at ${SECONDS}s"
SIZES=1,2,4,8,16,24,32,48,64,96,128,192,256
flash_cut 9 /tmp/flash9.json
{
  for cfg in "$S3" /tmp/flash9.json; do
    for fmt in auto bf16; do
      echo "== $cfg weight-format $fmt: decode, context 4096"
      bench --synthetic-config "$cfg" --weight-format $fmt --batches 1,8,64,256 --contexts 4096 \
        --decode-steps 16 --cudagraph-mode full_and_piecewise --cudagraph-capture-sizes $SIZES
      for p in 1024 8192; do
        echo "== $cfg weight-format $fmt: TTFT, prompt $p"
        bench --synthetic-config "$cfg" --weight-format $fmt --batches 1 --contexts 0 \
          --prompt-len $p --decode-steps 2 --repeats 3 --cudagraph-mode full_and_piecewise \
          --cudagraph-capture-sizes $SIZES,1024,8192
      done
    done
  done
} > "$OUT/step_bench.log" 2>&1
grep -E "^ +[0-9]+ +[0-9]+ |^== " "$OUT/step_bench.log" | cut -c1-150
echo "steps at ${SECONDS}s"
fi
{
  flash_cut 37 /tmp/f37.json
  echo "== Flash-37, 64 x 8k: decode at 8000; a prefill step of 64 x 32 tokens (serve's 2048 budget)"
  binfo --synthetic-config /tmp/f37.json --weight-format auto --batches 1,8,64 --contexts 8000,0 \
    --prompt-len 32 --decode-steps 16 --cudagraph-mode full_and_piecewise \
    --cudagraph-capture-sizes 1,2,4,8,16,32,64 2>&1 | rows
  for p in 1024 8192; do
    echo "== Flash-37 TTFT, prompt $p"
    binfo --synthetic-config /tmp/f37.json --weight-format auto --batches 1 --contexts 0 \
      --prompt-len $p --decode-steps 2 --repeats 2 --cudagraph-mode full_and_piecewise \
      --cudagraph-capture-sizes 1,2,4,8,16,32,64 2>&1 | rows
  done
  flash_cut 38 /tmp/f38.json
  echo "== Flash-38, 64 x 8k"
  binfo --synthetic-config /tmp/f38.json --weight-format auto --batches 1,64 --contexts 8000 \
    --decode-steps 8 --cudagraph-mode full_and_piecewise --cudagraph-capture-sizes 1,64 \
    2>&1 | rows
} > "$OUT/flash37.log" 2>&1
cat "$OUT/flash37.log"
echo "done at ${SECONDS}s"
