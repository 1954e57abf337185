#!/bin/bash
# On the H200 host (one call): the GPU suites touched since the last device run (the FP8
# activation rule on whole blocks, the kernels' shared cp.async / SwiGLU helpers, the test
# helpers) and the new weight-streaming MXFP4 expert kernels (moe_stream.h) against the CPU
# reference; their kernel bandwidth against the wide kernel (DSV4_MOE_STREAM=0 / 1) at 256 Flash
# experts; slice3 TTFT at 512 / 1k (streaming) and 8k (tiled, a regression check) in fp8 and
# bf16; the 1k fp8 op profile. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout ${RUN_TEST_S:-280} $R tests/dsv4_gpu_tests --gtest_filter="${RUN_TESTS:-CudaMoeStream.*:CudaMoeQuant.*:CudaMoeTiled.*:CudaFp8Linear.*:CudaModel.*:CudaOps.*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is|agreement|error at|tests ran" "$OUT/tests.log" | head -90
for v in 0 1; do
  echo "== kernels DSV4_MOE_STREAM=$v"
  DSV4_MOE_STREAM=$v timeout 90 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 30 2>&1 | grep -E "moe_mxfp4 |^op" | head -12
done
echo "kernels at ${SECONDS}s"
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== ${DSV4_MOE_STREAM:+DSV4_MOE_STREAM=$DSV4_MOE_STREAM }${*:2}"; "$@" | grep -E -A2 "^ batch|error|refuses" | tail -3; }
for len in 1024 512; do
  for v in 0 1; do DSV4_MOE_STREAM=$v row bench --precision fp8 --prompt-len $len --repeats 3; done
  row bench --precision bf16 --prompt-len $len --repeats 3
done
row bench --precision fp8 --prompt-len 8192 --repeats 3
row bench --precision bf16 --prompt-len 8192 --repeats 3
echo "benches at ${SECONDS}s"
DSV4_PROFILE_OPS=1 bench --precision fp8 --prompt-len 1024 --repeats 3 > "$OUT/profile1024.log"
grep -A24 "^op profile" "$OUT/profile1024.log" | head -26
echo "done at ${SECONDS}s"
