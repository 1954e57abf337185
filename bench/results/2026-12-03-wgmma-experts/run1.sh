#!/bin/bash
# On the H200 host (repository root, bundle in .gpu/bundle): the tiled-expert suites with the new
# wgmma kernels and the FP8-activation checks of the DSV4_FP8_PREFILL experiment, then slice3 TTFT
# (8k released formats and bf16, 1k, 32k) with the wgmma kernels against mma.sync
# (DSV4_MOE_WGMMA=1 / 0) in one call, FP8 prefill on and off, and the 8k op profile. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout 200 $R tests/dsv4_gpu_tests --gtest_filter='CudaMoeTiled*:CudaFp8Linear.Fp8Activations*:CudaModel.QuantizedFixtureWithFp8*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|error|Expected|Which is|p50=|agreement" "$OUT/tests.log" | head -60
bench() { timeout 100 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
for fmt in auto bf16; do
  for wg in 0 1; do
    echo "== $fmt prompt 8192 DSV4_MOE_WGMMA=$wg"
    DSV4_MOE_WGMMA=$wg bench --weight-format $fmt --prompt-len 8192 --repeats 3 | grep -E -A2 "^ batch|roofline|error" | tail -4
  done
done
echo "== auto prompt 8192 wgmma DSV4_FP8_PREFILL=1"
DSV4_FP8_PREFILL=1 bench --weight-format auto --prompt-len 8192 --repeats 3 | grep -E -A2 "^ batch|error" | tail -3
for wg in 0 1; do
  echo "== auto prompt 1024 DSV4_MOE_WGMMA=$wg"
  DSV4_MOE_WGMMA=$wg bench --weight-format auto --prompt-len 1024 --repeats 3 | grep -A2 "^ batch" | tail -2
  echo "== auto prompt 32768 DSV4_MOE_WGMMA=$wg"
  DSV4_MOE_WGMMA=$wg bench --weight-format auto --prompt-len 32768 --repeats 1 | grep -A2 "^ batch" | tail -2
done
echo "benches at ${SECONDS}s"
echo "== profile auto 8192 wgmma"
DSV4_PROFILE_OPS=1 bench --weight-format auto --prompt-len 8192 --repeats 1 > "$OUT/profile.log"
grep -A30 "^op profile" "$OUT/profile.log" | head -32
echo "done at ${SECONDS}s"
