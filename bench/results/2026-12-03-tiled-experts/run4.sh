#!/bin/bash
# On the H200 host: run3's FP8-activation checks again after the fix (the scale pointers set
# before cuBLASLt's heuristic), and slice3 8k TTFT with DSV4_FP8_PREFILL=0 against 1.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
timeout 60 $R tests/dsv4_gpu_tests --gtest_filter='CudaFp8Linear.Fp8Activations*:CudaModel.QuantizedFixtureWithFp8*' > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|p50=|greedy agreement|error" "$OUT/tests.log" | head -30
for f in 0 1; do
  echo "== prompt 8192 DSV4_FP8_PREFILL=$f"
  DSV4_FP8_PREFILL=$f timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 --prompt-len 8192 --repeats 2 2>&1 | grep -A2 "^ batch" | tail -2
done
