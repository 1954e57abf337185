#!/usr/bin/env bash
# Issue #19 on the H200, one call: the GPU suite with synthetic models in the released formats
# (FP8 projections, MXFP4 experts) and the graph suite again with dense ones; the kernel
# bandwidths; decode and TTFT quantised against bf16 side by side on slice3 and Flash cut to 9
# layers; the largest Flash cut that fits with 64 x 8k of state, quantised.
#   run19.sh tests   the GPU suites and the kernel benchmarks
#   run19.sh steps   the step benchmarks and the largest cut
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
rc=0
if [ "$PART" = tests ]; then
timeout 420 bash $B/run.sh tests/dsv4_gpu_tests > "$OUT/gpu_tests.log" 2>&1 || rc=1
grep -E "FAILED|PASSED|SKIPPED \]" "$OUT/gpu_tests.log" | tail -8
DSV4_TEST_WEIGHT_FORMAT=bf16 timeout 200 bash $B/run.sh tests/dsv4_gpu_tests \
  --gtest_filter='CudaGraphs.*:CudaModel.WorkerSampling*' > "$OUT/gpu_tests_dense.log" 2>&1 || rc=1
grep -E "FAILED|PASSED" "$OUT/gpu_tests_dense.log" | tail -3
timeout 240 bash $B/run.sh bench/dsv4_gpu_kernels_bench --fp8-only > "$OUT/kernels_fp8.log" 2>&1
timeout 240 bash $B/run.sh bench/dsv4_gpu_kernels_bench ${MOEQ_BENCH_FLAG:---moe-quant-only} > "$OUT/kernels_moe_quant.log" 2>&1
grep -E "fp8|mxfp4|moe_experts|HBM" "$OUT/kernels_fp8.log" "$OUT/kernels_moe_quant.log" | cut -c1-160 | head -60
exit $rc
fi
bench() { timeout 240 bash $B/run.sh node/dsv4-node bench --device cuda --log-level warning "$@"; }
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
grep -E "^ +[0-9]+ +[0-9]+ |^== " "$OUT/step_bench.log" | head -60
{
  for n in 41 40 39 38 37 36; do
    flash_cut $n /tmp/flash_cut.json
    echo "== Flash cut to $n layers, quantised, 64 slots x 8k"
    if bench --synthetic-config /tmp/flash_cut.json --weight-format auto --batches 1,64 \
        --contexts 8000 --decode-steps 16 --cudagraph-mode full_and_piecewise \
        --cudagraph-capture-sizes 1,2,4,8,16,32,64 --log-level info 2>&1 | tee /tmp/cut_$n.log |
        grep -E "^ +[0-9]+ +8000|memory_plan|does not fit"; then
      grep -q "^ \+1 \+8000" /tmp/cut_$n.log && break
    fi
  done
} > "$OUT/largest_cut.log" 2>&1
cat "$OUT/largest_cut.log" | cut -c1-300
exit $rc
