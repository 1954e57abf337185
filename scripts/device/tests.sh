#!/usr/bin/env bash
# On the GPU host (repository root, bundle in .gpu/bundle, see WORKSPACE.notes, "GPU bundle"): the GPU suite, then
# the serving suite on the GPU worker in fp32 and bf16. Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
export DSV4_TEST_DATA_DIR=$PWD/tests/data
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
rc=0
bash $B/run.sh tests/dsv4_gpu_tests ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} 2>&1 | tee "$OUT/gpu_tests.log" || rc=1
for p in fp32 bf16; do
  DSV4_TEST_DEVICE=cuda DSV4_TEST_PRECISION=$p bash $B/run.sh tests/dsv4_tests \
    --gtest_filter='Server*' 2>&1 | tee "$OUT/server_cuda_$p.log" || rc=1
done
exit $rc
