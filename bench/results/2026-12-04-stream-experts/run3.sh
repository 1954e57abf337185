#!/bin/bash
# On the H200 host (one call): the streaming kernels with the k loop compiled per group count
# (run2's issued the products of absent groups predicated off): the tests, kernel bandwidth
# against the wide kernel (DSV4_MOE_STREAM=0) and against a variant plugin (.gpu/variants/b: 8
# warps and 4 groups a block, two blocks an SM), TTFT at 1k, and Nsight Compute's issue
# statistics of the gate_up kernel. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
VB=$PWD/.gpu/variants/b/libdsv4_cuda.so
SECONDS=0
timeout 120 $R tests/dsv4_gpu_tests --gtest_filter="CudaMoeStream.*" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is|error at" "$OUT/tests.log" | head -20
kb() { timeout 90 $R bench/dsv4_gpu_kernels_bench --moe-quant-only --warmup-ms 20 --iters 30 2>&1 | grep -E "moe_mxfp4 .*T=(64|256|512|1024|2048)" | head -6; }
echo "== kernels wide (DSV4_MOE_STREAM=0)"; DSV4_MOE_STREAM=0 kb
echo "== kernels stream"; kb
echo "== kernels stream, variant b"; DSV4_CUDA_PLUGIN=$VB kb
echo "== kernels stream, forced everywhere (DSV4_MOE_STREAM=2)"; DSV4_MOE_STREAM=2 kb
echo "kernels at ${SECONDS}s"
bench() { timeout 60 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
row() { echo "== $1 ${*:3}"; "${@:2}" | grep -E -A2 "^ batch|error|refuses" | tail -2 | head -1; }
for len in 1024 512; do
  DSV4_MOE_STREAM=0 row wide bench --precision fp8 --prompt-len $len --repeats 3
  row stream bench --precision fp8 --prompt-len $len --repeats 3
  DSV4_CUDA_PLUGIN=$VB row stream-b bench --precision fp8 --prompt-len $len --repeats 3
done
row stream bench --precision bf16 --prompt-len 1024 --repeats 3
echo "benches at ${SECONDS}s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 100 "$NCU" --clock-control none --kernel-name regex:ExpertStream --launch-count 2 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
  $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto \
  --batches 1 --contexts 0 --decode-steps 2 --precision fp8 --prompt-len 1024 --repeats 1 > "$OUT/ncu_stream.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s"
grep -E "ExpertStream|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |Issued Instructions  " "$OUT/ncu_stream.txt" | head -30
echo "done at ${SECONDS}s"
