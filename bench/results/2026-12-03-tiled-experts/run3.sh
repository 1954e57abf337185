#!/bin/bash
# On the H200 host (from the repository root, bundle in .gpu/bundle): the FP8-activation products
# (DSV4_FP8_PREFILL) against the CPU reference and on the quantised fixture, the model suite on
# the tiled experts, then slice3 TTFT with DSV4_FP8_PREFILL=0 against 1 in one call (weights as
# released, the tiled experts on) and the op profile of the 8k prefill with it. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout 200 $R tests/dsv4_gpu_tests --gtest_filter='CudaFp8Linear.*:CudaModel.*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"
grep -E "^\[ *(OK|FAILED|PASSED) |Failure|p50=|greedy agreement|max_abs_err" "$OUT/tests.log" | grep -vE "max_abs_err=[0-9.e-]+ \(max" | tail -40
grep -A3 "Fp8ActivationsStayWithinTheirError" "$OUT/tests.log" | head -8
grep -c "max_abs_err" "$OUT/tests.log"
bench() { timeout 100 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
for p in 1024 8192; do
  for f in 0 1; do
    echo "== prompt $p DSV4_FP8_PREFILL=$f"
    DSV4_FP8_PREFILL=$f bench --prompt-len $p --repeats 3 | grep -A2 "^ batch" | tail -2
  done
done
echo "== profile 8192 DSV4_FP8_PREFILL=1"
DSV4_PROFILE_OPS=1 DSV4_FP8_PREFILL=1 bench --prompt-len 8192 --repeats 1 > "$OUT/profile.log"
grep -A24 "^op profile" "$OUT/profile.log" | head -26
echo "done at ${SECONDS}s"
echo "== profile 8192 bf16 weights (the tiled experts on bf16 weights)"
DSV4_PROFILE_OPS=1 timeout 100 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format bf16 --batches 1 --contexts 0 --decode-steps 2 --prompt-len 8192 --repeats 1 > "$OUT/profile_bf16.log" 2>&1
grep -A8 "^op profile" "$OUT/profile_bf16.log" | head -10
echo "done at ${SECONDS}s"
