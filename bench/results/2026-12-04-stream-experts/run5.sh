#!/bin/bash
# On the H200 host (one call), the build with the streaming kernels' copy addresses computed once
# and the compressor's batched loads: tests, kernel bandwidth beside the wide kernel and the
# previous build (.gpu/variants/prev, 74b8f31), slice3 TTFT at 512 / 1k / 8k in fp8 and bf16, the
# 1k op profile; end to end,
# issue #20's loadgen table in fp8 with DSV4_MOE_STREAM = 0 / 1 side by side, then the step
# budget (--max-batched-tokens 1024 against the default 2048) in fp8: an 8k prompt's TTFT and
# the ITL of 1k prompts at concurrency 16 and 64. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
PREV=$PWD/.gpu/variants/prev/libdsv4_cuda.so
timeout 90 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.Ragged*:CudaMoeStream.GivesTheWide*:CudaMoeQuant.WideKernelGivesTheSameBits:CudaOps.Compressors*:CudaOps.Attention*:CudaModel.GoldenFixtureFp32:CudaModel.Quantized*" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is" "$OUT/tests.log" | head -10
kb() { timeout 90 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 30 2>&1 | grep -E "moe_mxfp4 .*T=(256|512|1024|2048)" | head -6; }
echo "== kernels wide (DSV4_MOE_STREAM=0)"; DSV4_MOE_STREAM=0 kb
echo "== kernels stream, previous build"; DSV4_CUDA_PLUGIN=$PREV kb
echo "== kernels stream"; kb
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== $1 ${*:3}"; "${@:2}" | grep -E -A2 "^ batch|error|refuses" | tail -2 | head -1; }
for len in 1024 512; do
  DSV4_MOE_STREAM=0 row wide bench --precision fp8 --prompt-len $len --repeats 3
  DSV4_CUDA_PLUGIN=$PREV row stream-prev bench --precision fp8 --prompt-len $len --repeats 3
  row stream bench --precision fp8 --prompt-len $len --repeats 3
  row stream bench --precision bf16 --prompt-len $len --repeats 3
done
DSV4_CUDA_PLUGIN=$PREV row prev bench --precision fp8 --prompt-len 8192 --repeats 3
row stream bench --precision fp8 --prompt-len 8192 --repeats 3
row stream bench --precision bf16 --prompt-len 8192 --repeats 3
echo "benches at ${SECONDS}s"
DSV4_PROFILE_OPS=1 bench --precision fp8 --prompt-len 1024 --repeats 3 > "$OUT/profile1024.log"
grep -E "MoeExperts \[1024|Compress \[1024|^op profile" "$OUT/profile1024.log" | head -6
LT_VAR=DSV4_MOE_STREAM LT_VALUES="0 1" LT_PRECISION=fp8 LT_REQUESTS=64 timeout 330 bash scripts/device/loadgen_table.sh > /dev/null 2>&1
grep -vE "^\s*$" "$OUT/loadgen_table.log" | grep -vE "level=(info|warning)" | tail -30
echo "loadgen at ${SECONDS}s"
left=$((540 - SECONDS))
if [ $left -gt 90 ]; then
  CP_CHUNKS="1024 2048" CP_PRECISION=fp8 CP_CONC=16,64 CP_REPEATS=3 timeout $left bash scripts/device/chunked_prefill.sh > /dev/null 2>&1
  grep -vE "^\s*$" "$OUT/chunked_prefill.log" | grep -vE "level=(info|warning)" | tail -24
fi
echo "done at ${SECONDS}s"
