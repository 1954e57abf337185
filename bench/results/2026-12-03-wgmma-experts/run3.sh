#!/bin/bash
# On the H200 host: the FP8 expert kernels (precision fp8), the 4-token TF32 indexer blocks and
# the deeper-prefetch mix kernels against the CPU reference; slice3 TTFT in bf16 against fp8 at
# 1k, 8k and 32k (one call), the 8k fp8 op profile, per-kernel times under ncu, and issue #20's
# loadgen table in bf16 and fp8. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout 260 $R tests/dsv4_gpu_tests --gtest_filter='CudaOps.Hyper*:CudaOps.Indexer*:CudaMoeTiled.*:CudaModel.Quantized*:CudaFp8Linear.Fp8*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|error|Expected|Which is|agreement|swaps|error at" "$OUT/tests.log" | head -70
bench() { timeout 120 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
for len in 8192 1024 32768; do
  reps=3; [ $len = 32768 ] && reps=2
  for p in bf16 fp8; do
    echo "== prompt $len $p"
    bench --precision $p --prompt-len $len --repeats $reps | grep -E -A2 "^ batch|error" | tail -3
  done
done
echo "benches at ${SECONDS}s"
echo "== profile 8k fp8"
DSV4_PROFILE_OPS=1 bench --precision fp8 --prompt-len 8192 --repeats 1 > "$OUT/profile8k.log"
grep -A24 "^op profile" "$OUT/profile8k.log" | head -26
echo "== ncu 8k fp8"
timeout 150 ncu --clock-control none --target-processes all --kernel-name regex:'MixKernel|HcFinal|ScoreMma|SelectKernel|QuantizeKernel|ExpertFp8|CombineAssign' --launch-count 24 --metrics gpu__time_duration.sum --csv $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 1 --prompt-len 8192 --repeats 1 --precision fp8 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?"; grep -E '"gpu__time' "$OUT/ncu.csv" | awk -F'","' '{print $5, $(NF)}' | sed 's/(.*)//' | cut -c1-150 | head -26
echo "at ${SECONDS}s"
LT_VAR=LT_PRECISION LT_VALUES="bf16 fp8" LT_REQUESTS=128 bash scripts/device/loadgen_table.sh > /dev/null 2>&1
grep -vE "^\s*$" "$OUT/loadgen_table.log" | grep -vE "level=(info|warning)" | tail -40
echo "done at ${SECONDS}s"
