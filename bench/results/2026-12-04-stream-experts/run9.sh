#!/bin/bash
# On the H200 host (one call), the build as committed (DSV4_MOE_STREAM_WGMMA a backend switch
# now): the streaming kernels' tests on both product paths, the wide kernel's bit test, the
# fixtures, kernel bandwidth and slice3 TTFT with the products on wgmma (default) and mma.sync.
# Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout 110 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.*:CudaMoeQuant.WideKernelGivesTheSameBits:CudaOps.WideExpertKernel*:CudaModel.Quantized*:CudaModel.GoldenFixtureFp32" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is" "$OUT/tests.log" | head -20
kb() { timeout 60 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 30 2>&1 | grep -E "moe_mxfp4 .*T=(512|1024)" | head -3; }
echo "== kernels wgmma"; kb
echo "== kernels mma.sync"; DSV4_MOE_STREAM_WGMMA=0 kb
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== $1 ${*:3}"; "${@:2}" | grep -E -A2 "^ batch|error|refuses" | tail -2 | head -1; }
for len in 1024 512; do
  row wgmma bench --precision fp8 --prompt-len $len --repeats 3
  DSV4_MOE_STREAM_WGMMA=0 row mma.sync bench --precision fp8 --prompt-len $len --repeats 3
  row wgmma bench --precision bf16 --prompt-len $len --repeats 3
done
echo "done at ${SECONDS}s"
