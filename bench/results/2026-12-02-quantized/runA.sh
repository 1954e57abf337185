#!/usr/bin/env bash
# Issue #19, kernel variants and the prefill scratch on the H200, one call: the FP8 GEMV variants
# (DSV4_FP8_GEMV_VARIANT, warmed up) and the MXFP4 single-token variants
# (DSV4_MOEQ_DECODE_VARIANT) with their GPU tests; Flash-37 TTFT at 1k and 8k with a layer's
# scratch reused by the next (46c9533), and its scratch high water against the plan.
set -uo pipefail
[ -d .gpu/bundle ] || tar -C .gpu -xJf .gpu/pack/bundle.tar.xz
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
B=.gpu/bundle
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
for v in 0 1 2 3; do
  DSV4_FP8_GEMV_VARIANT=$v timeout 90 bash $B/run.sh bench/dsv4_gpu_kernels_bench --fp8-only \
    --warmup-ms 20 --iters 500 > "$OUT/fp8_v$v.log" 2>&1
done
for v in 1 2 3; do
  DSV4_FP8_GEMV_VARIANT=$v timeout 90 bash $B/run.sh tests/dsv4_gpu_tests \
    --gtest_filter='CudaFp8Linear.*' > "$OUT/fp8_tests_v$v.log" 2>&1
done
echo "fp8 done at ${SECONDS}s"
grep -H -E "\[fp8\]" "$OUT"/fp8_v*.log | awk '{print $1, $2, $3, $4, $5, $6, $7}' | head -80
grep -H -E "PASSED|FAILED" "$OUT"/fp8_tests_v*.log
for v in 0 1 2 3; do
  DSV4_MOEQ_DECODE_VARIANT=$v timeout 90 bash $B/run.sh bench/dsv4_gpu_kernels_bench \
    --moe-quant-only --warmup-ms 20 --iters 200 > "$OUT/moeq_v$v.log" 2>&1
done
for v in 1 2 3; do
  DSV4_MOEQ_DECODE_VARIANT=$v timeout 90 bash $B/run.sh tests/dsv4_gpu_tests \
    --gtest_filter='CudaMoeQuant.TinyShapes*:CudaMoeQuant.SingleToken*:CudaMoeQuant.Mxfp4LargeScales*' \
    > "$OUT/moeq_tests_v$v.log" 2>&1
done
grep -H -E "mxfp4|moe_experts" "$OUT"/moeq_v*.log | awk '{print $1, $2, $3, $4, $5, $6}'
grep -H -E "PASSED|FAILED" "$OUT"/moeq_tests_v*.log
echo "moeq done at ${SECONDS}s"
flash_cut 37 /tmp/f37.json
f37() {
  timeout 240 bash $B/run.sh node/dsv4-node bench --device cuda --log-level info \
    --synthetic-config /tmp/f37.json --weight-format auto --decode-steps 2 --repeats 2 \
    --cudagraph-mode full_and_piecewise --cudagraph-capture-sizes 1,2,4,8,16,32,64 "$@" 2>&1 |
    grep -E "^ +[0-9]+ +[0-9]+ |memory_plan|scratch high water|error|does not fit" | cut -c1-400
  echo "at ${SECONDS}s"
}
echo "== Flash-37, 64 x 8k of state: decode at 8000, prefill of 1 x 128 and 64 x 128 tokens"
f37 --batches 1,64 --contexts 8000,0 --prompt-len 128
for p in 8192 1024; do
  echo "== Flash-37 TTFT, prompt $p"
  f37 --batches 1 --contexts 0 --prompt-len $p
done
