#!/bin/bash
# On the H200 host (one call): the streaming kernels on warpgroup MMAs (A, the expanded weights,
# from registers; B, the staged activations, from shared memory in the 128-byte swizzle), an
# experiment switch DSV4_MOE_STREAM_WG (1 wgmma, 0 mma.sync): tests against the CPU reference
# (and the mma.sync kernels' bits against the wide kernel's), kernel bandwidth and TTFT side by
# side, Nsight Compute's issue statistics. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
DSV4_MOE_STREAM_WG=1 timeout 100 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.*" > "$OUT/tests_wg.log" 2>&1
echo "tests wgmma rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is|max_abs|case" "$OUT/tests_wg.log" | head -30
DSV4_MOE_STREAM_WG=0 timeout 40 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.GivesTheWide*:CudaMoeStream.Ragged*" > "$OUT/tests_sync.log" 2>&1
echo "tests mma.sync rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure" "$OUT/tests_sync.log" | head -6
kb() { timeout 90 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 30 2>&1 | grep -E "moe_mxfp4 .*T=(256|512|1024|2048)" | head -6; }
echo "== kernels wide"; DSV4_MOE_STREAM=0 kb
echo "== kernels stream mma.sync"; DSV4_MOE_STREAM_WG=0 kb
echo "== kernels stream wgmma"; DSV4_MOE_STREAM_WG=1 kb
echo "== kernels stream wgmma forced"; DSV4_MOE_STREAM=2 DSV4_MOE_STREAM_WG=1 kb
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== $1 ${*:3}"; "${@:2}" | grep -E -A2 "^ batch|error|refuses" | tail -2 | head -1; }
for len in 1024 512; do
  DSV4_MOE_STREAM_WG=0 row mma.sync bench --precision fp8 --prompt-len $len --repeats 3
  DSV4_MOE_STREAM_WG=1 row wgmma bench --precision fp8 --prompt-len $len --repeats 3
  DSV4_MOE_STREAM_WG=1 row wgmma bench --precision bf16 --prompt-len $len --repeats 3
done
echo "benches at ${SECONDS}s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
DSV4_MOE_STREAM_WG=1 timeout 60 "$NCU" --clock-control none --kernel-name regex:ExpertStream --launch-count 2 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
  $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto \
  --batches 1 --contexts 0 --decode-steps 2 --precision fp8 --prompt-len 1024 --repeats 1 > "$OUT/ncu_wg.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s"
grep -E "ExpertStream|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible|Warp Cycles Per Issued|Executed Instructions  " "$OUT/ncu_wg.txt" | sed 's/(const __nv.*//' | head -20
echo "done at ${SECONDS}s"
