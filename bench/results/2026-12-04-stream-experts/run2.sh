#!/bin/bash
# On the H200 host (one call): the suites run1 did not reach (its test budget ran out), the
# streaming kernels' ring depth (DSV4_MOE_STREAM_STAGES 4 / 5 / 6, an experiment switch) against
# the wide kernel at 256 Flash experts, Nsight Compute on the streaming kernels of a 1k prefill,
# slice3 TTFT at 1k. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout ${RUN_TEST_S:-200} $R tests/dsv4_gpu_tests --gtest_filter="${RUN_TESTS:-CudaMoeStream.*:CudaMoeQuant.WideKernelGivesTheSameBits:CudaMoeQuant.Single*:CudaMoeTiled.*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is|error at|tests ran" "$OUT/tests.log" | head -60
for v in "0 4" "1 4" "1 5" "1 6"; do
  set -- $v
  echo "== kernels DSV4_MOE_STREAM=$1 DSV4_MOE_STREAM_STAGES=$2"
  DSV4_MOE_STREAM=$1 DSV4_MOE_STREAM_STAGES=$2 timeout 90 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 30 2>&1 | grep -E "moe_mxfp4 .*T=(256|512|1024|2048)" | head -6
done
echo "kernels at ${SECONDS}s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 "$NCU" --clock-control none --kernel-name regex:ExpertStream --launch-count 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
  $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto \
  --batches 1 --contexts 0 --decode-steps 2 --precision fp8 --prompt-len 1024 --repeats 1 > "$OUT/ncu_stream.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s"
grep -E "ExpertStream|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Stall|Issued Warp|No Eligible|Active Warps|Registers|Shared Memory Config|L2 Hit|Mem Busy|Max Bandwidth|Warp Cycles Per Issued|Achieved Occupancy|Theoretical Occupancy|Block Limit" "$OUT/ncu_stream.txt" | head -60
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== ${DSV4_MOE_STREAM:+DSV4_MOE_STREAM=$DSV4_MOE_STREAM }${DSV4_MOE_STREAM_STAGES:+stages=$DSV4_MOE_STREAM_STAGES }${*:2}"; "$@" | grep -E -A2 "^ batch|error|refuses" | tail -2 | head -1; }
DSV4_MOE_STREAM=0 row bench --precision fp8 --prompt-len 1024 --repeats 3
for st in 4 6; do DSV4_MOE_STREAM_STAGES=$st row bench --precision fp8 --prompt-len 1024 --repeats 3; done
echo "done at ${SECONDS}s"
