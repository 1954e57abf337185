#!/bin/bash
# On the H200 host (one call): the streaming kernels with the staged activations' slots swizzled
# (conflict-free copies), one 16-row tile a warp and 8 groups a pass (the build) against two
# tiles a warp and 4 groups (.gpu/variants/c: half the shared-memory reads of activations per
# weight byte, passes of 32): tests, kernel bandwidth beside the wide kernel, TTFT at 512 / 1k,
# Nsight Compute of both gate_up kernels. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
VC=$PWD/.gpu/variants/c/libdsv4_cuda.so
SECONDS=0
timeout 120 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.*" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is|error at" "$OUT/tests.log" | head -20
DSV4_CUDA_PLUGIN=$VC timeout 60 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.Ragged*:CudaMoeStream.GivesTheWide*" > "$OUT/tests_c.log" 2>&1
echo "tests (variant c) rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is" "$OUT/tests_c.log" | head -20
kb() { timeout 90 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 30 2>&1 | grep -E "moe_mxfp4 .*T=(256|512|1024|2048)" | head -6; }
echo "== kernels wide (DSV4_MOE_STREAM=0)"; DSV4_MOE_STREAM=0 kb
echo "== kernels stream"; kb
echo "== kernels stream, variant c"; DSV4_CUDA_PLUGIN=$VC kb
echo "kernels at ${SECONDS}s"
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== $1 ${*:3}"; "${@:2}" | grep -E -A2 "^ batch|error|refuses" | tail -2 | head -1; }
for len in 1024 512; do
  DSV4_MOE_STREAM=0 row wide bench --precision fp8 --prompt-len $len --repeats 3
  row stream bench --precision fp8 --prompt-len $len --repeats 3
  DSV4_CUDA_PLUGIN=$VC row stream-c bench --precision fp8 --prompt-len $len --repeats 3
done
echo "benches at ${SECONDS}s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in main c; do
  P=""; [ $v = c ] && P=$VC
  DSV4_CUDA_PLUGIN=$P timeout 60 "$NCU" --clock-control none --kernel-name regex:ExpertStream --launch-count 1 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
    $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto \
    --batches 1 --contexts 0 --decode-steps 2 --precision fp8 --prompt-len 1024 --repeats 1 > "$OUT/ncu_$v.txt" 2>&1
  echo "== ncu $v rc=$? at ${SECONDS}s"
  grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Issued Warp|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Spilling Requests  " "$OUT/ncu_$v.txt" | head -12
done
echo "done at ${SECONDS}s"
