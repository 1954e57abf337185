#!/bin/bash
# On the GPU host (one call, the session's last device time), after run2 (bit-equal to the wgmma
# kernels, slower at every size): the ring follows the step's token tiles (MoeTiledWsRows: 256 /
# 128 / 64 assignments a tile with 4 / 5 / 6 MXFP4 stages, 5 / 6 / 10 raw slices) and each
# tile's rows are loaded a tile ahead into a table ring (no order[] loads at tile starts, none in
# the down epilogue). The tiled tests; the streaming kernels' tests (this session moved their
# pair-order cast to CastToBf16Pair4; the previous session's unverified commits); slice3 TTFT
# against DSV4_MOE_WS=0 in the same call. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 60 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeTiled.*:-CudaMoeTiled.FlashWidthsMatchReference" > "$OUT/tiled_tests.log" 2>&1
echo "tiled tests rc=$? at ${SECONDS}s"
grep -E "^\[ *(OK|FAILED|PASSED) |Failure|differ|Expected|Which is|error" "$OUT/tiled_tests.log" | head -20
bench() { timeout 40 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== $1 ${*:3}"; "${@:2}" | tee -a "$OUT/ttft.log" | grep -E -A2 "^ batch|rror|refuses" | tail -2 | head -1; }
DSV4_MOE_WS=1 row ws bench --precision fp8 --prompt-len 8192 --repeats 3
DSV4_MOE_WS=0 row wgmma bench --precision fp8 --prompt-len 8192 --repeats 3
DSV4_MOE_WS=1 row ws bench --precision fp8 --prompt-len 2048 --repeats 3
DSV4_MOE_WS=0 row wgmma bench --precision fp8 --prompt-len 2048 --repeats 3
row stream bench --precision fp8 --prompt-len 1024 --repeats 3
DSV4_MOE_WS=1 DSV4_MOE_TILED=64 row ws-forced bench --precision fp8 --prompt-len 1024 --repeats 3
DSV4_MOE_WS=1 row ws bench --precision bf16 --prompt-len 8192 --repeats 3
DSV4_MOE_WS=0 row wgmma bench --precision bf16 --prompt-len 8192 --repeats 3
echo "stream tests at ${SECONDS}s"
timeout 90 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.*:CudaModel.Quantized*:CudaModel.GoldenFixtureFp32" > "$OUT/run9_tests.log" 2>&1
echo "stream tests rc=$? at ${SECONDS}s"
grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is" "$OUT/run9_tests.log" | head -20
echo "done at ${SECONDS}s"
