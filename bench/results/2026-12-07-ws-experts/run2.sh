#!/bin/bash
# On the GPU host (one call), after run1 (the first version: correct, slower than wgmma): the
# producer no longer waits for its own copies (they arrive on the stage barrier as they land;
# raw MXFP4 / FP8 slices in a deeper ring, copied 4 / 6 stages ahead) and MXFP4 activations come
# in the expansion's pair order (no unshuffle). Tests, kernel rows, slice3 TTFT against
# DSV4_MOE_WS=0 in the same call; the Flash-width test last. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 150 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeTiled.*:-CudaMoeTiled.FlashWidthsMatchReference" > "$OUT/tiled_tests.log" 2>&1
echo "tiled tests rc=$? at ${SECONDS}s"
grep -E "^\[ *(OK|FAILED|PASSED) |Failure|bit for bit|differ|Expected|Which is|error" "$OUT/tiled_tests.log" | head -40
kb() { timeout 100 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 20 2>&1 | grep -E "moe_(mxfp4|experts) .*T=(1024|2048|8192)|fail|rror"; }
echo "== kernels ws (at ${SECONDS}s)"; kb | tee "$OUT/kernels_ws.log"
echo "== kernels wgmma"; DSV4_MOE_WS=0 kb | tee "$OUT/kernels_wgmma.log"
echo "== kernels ws forced at every T"; DSV4_MOE_TILED=64 kb | tee "$OUT/kernels_ws_forced.log"
bench() { timeout 80 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== $1 ${*:3}"; "${@:2}" | tee -a "$OUT/ttft.log" | grep -E -A2 "^ batch|rror|refuses" | tail -2 | head -1; }
row ws bench --precision bf16 --prompt-len 8192 --repeats 3
DSV4_MOE_WS=0 row wgmma bench --precision bf16 --prompt-len 8192 --repeats 3
row ws bench --precision fp8 --prompt-len 8192 --repeats 3
DSV4_MOE_WS=0 row wgmma bench --precision fp8 --prompt-len 8192 --repeats 3
row ws bench --precision fp8 --prompt-len 2048 --repeats 3
DSV4_MOE_WS=0 row wgmma bench --precision fp8 --prompt-len 2048 --repeats 3
row stream bench --precision fp8 --prompt-len 1024 --repeats 3
DSV4_MOE_TILED=64 row ws-forced bench --precision fp8 --prompt-len 1024 --repeats 3
echo "flash-width test at ${SECONDS}s"
timeout 200 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeTiled.FlashWidthsMatchReference" > "$OUT/flash_test.log" 2>&1
echo "flash test rc=$?"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure" "$OUT/flash_test.log" | head
echo "done at ${SECONDS}s"
