#!/bin/bash
# On the H200 host (from the repository root, bundle in .gpu/bundle, the lab in .gpu/lab): the
# expert suites on the tree with 128-row tiles from 128 assignments an expert, then TTFT with the
# tiled expert GEMMs (DSV4_MOE_TILED=1) against without (0) in one call (slice3, 8k and 32k,
# released formats and bf16), the op profile of the 8k prefill, cuBLAS's grouped GEMM, and issue
# #20's loadgen table (scripts/device/loadgen_table.sh). Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
B=.gpu/bundle
R="bash $B/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout 240 $R tests/dsv4_gpu_tests --gtest_filter='CudaMoeTiled*:CudaMoeQuant*:CudaOps.*Moe*:CudaOps.*Expert*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|tests? ran" "$OUT/tests.log" | tail -40
bench() { timeout 100 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
for fmt in auto bf16; do
  for tiled in 0 1; do
    echo "== $fmt prompt 8192 DSV4_MOE_TILED=$tiled"
    DSV4_MOE_TILED=$tiled bench --weight-format $fmt --prompt-len 8192 --repeats 3 | grep -A2 "^ batch" | tail -2
  done
done
for tiled in 0 1; do
  echo "== auto prompt 32768 DSV4_MOE_TILED=$tiled"
  DSV4_MOE_TILED=$tiled bench --weight-format auto --prompt-len 32768 --repeats 1 | grep -A2 "^ batch" | tail -2
done
echo "benches at ${SECONDS}s"
echo "== profile auto 8192 tiled"
DSV4_PROFILE_OPS=1 bench --weight-format auto --prompt-len 8192 --repeats 1 > "$OUT/profile.log"
grep -A26 "^op profile" "$OUT/profile.log" | head -28
echo "== lab grouped"
timeout 60 $R ../lab/prefill_gemm_lab grouped 2>&1 | tail -6
echo "at ${SECONDS}s"
LT_REQUESTS=128 bash scripts/device/loadgen_table.sh > /dev/null 2>&1
grep -vE "^\s*$" "$OUT/loadgen_table.log" | grep -vE "level=(info|warning)" | tail -40
echo "done at ${SECONDS}s"
