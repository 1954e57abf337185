#!/bin/bash
# On the H200 host (one call, ~5 device minutes left in the session): the suites touched by
# precision fp8 (the FP8 projections padded to 16 rows), the TF32 indexer and the staged mHC
# kernels against the CPU reference; slice3 TTFT in bf16 against fp8 at 8k and 1k in one call,
# the staged mHC kernels against the previous ones (DSV4_HC_STAGED=0), the tiled experts
# forced at 1k (DSV4_MOE_TILED=64), 32k; the 1k and 8k fp8 op profiles; then, in the time left
# (RUN4_BUDGET seconds in all), issue #20's loadgen table in fp8. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
BUDGET=${RUN4_BUDGET:-270}
SECONDS=0
timeout 120 $R tests/dsv4_gpu_tests --gtest_filter="${RUN4_TESTS:-CudaOps.Hyper*:CudaOps.Indexer*:CudaMoeTiled.Fp8*:CudaModel.Quantized*:CudaFp8Linear.*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is|agreement|error at" "$OUT/tests.log" | head -80
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== ${DSV4_HC_STAGED:+DSV4_HC_STAGED=$DSV4_HC_STAGED }${DSV4_MOE_TILED:+DSV4_MOE_TILED=$DSV4_MOE_TILED }${*:2}"; "$@" | grep -E -A2 "^ batch|error|refuses" | tail -3; }
for len in 8192 1024; do
  row bench --precision bf16 --prompt-len $len --repeats 3
  row bench --precision fp8 --prompt-len $len --repeats 3
  DSV4_HC_STAGED=0 row bench --precision fp8 --prompt-len $len --repeats 3
  echo "at ${SECONDS}s"
done
DSV4_MOE_TILED=64 row bench --precision fp8 --prompt-len 1024 --repeats 3
row bench --precision bf16 --prompt-len 32768 --repeats 1
row bench --precision fp8 --prompt-len 32768 --repeats 1
echo "benches at ${SECONDS}s"
for len in 1024 8192; do
  echo "== profile $len fp8"
  DSV4_PROFILE_OPS=1 bench --precision fp8 --prompt-len $len --repeats 1 > "$OUT/profile$len.log"
  grep -A28 "^op profile" "$OUT/profile$len.log" | head -30
done
echo "profiles at ${SECONDS}s"
left=$((BUDGET - SECONDS))
if [ $left -gt 60 ]; then
  LT_VALUES=fp8 LT_VAR=LT_PRECISION LT_REQUESTS=64 timeout $left bash scripts/device/loadgen_table.sh > /dev/null 2>&1
  grep -vE "^\s*$" "$OUT/loadgen_table.log" | grep -vE "level=(info|warning)" | tail -20
fi
echo "done at ${SECONDS}s"
