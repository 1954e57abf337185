#!/bin/bash
# The round's second H200 call (the first ran scripts/device/tests.sh's GPU suite alone): the
# serving suite on the GPU worker in fp32, then the CPU-side distributed figures on a host with
# 16 cores (control-plane cost, TP1/TP2/TP4 through loadgen, Gloo all-reduce).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
export DSV4_TEST_DATA_DIR=$PWD/tests/data
nproc | tee "$OUT/nproc.txt"
DSV4_TEST_DEVICE=cuda DSV4_TEST_PRECISION=fp32 timeout 200 bash $B/run.sh tests/dsv4_tests \
  --gtest_filter='Server*' 2>&1 | grep -v '^ts=' | tee "$OUT/server_cuda_fp32.log"
timeout 120 bash $B/run.sh bench/dsv4_control_plane_bench --steps 2000 2>&1 | grep -v '^ts=' |
  tee "$OUT/control_plane.log"
NODE="bash $B/run.sh node/dsv4-node" timeout 150 bash bench/results/2026-12-02-distributed/tp_cpu.sh 2>&1 |
  grep -v '^ts=' | tee "$OUT/tp_cpu.log"
timeout 60 bash $B/run.sh bench/dsv4_gloo_allreduce_bench --world-sizes 2,4 --rows 1,16,64,256 2>&1 |
  tee "$OUT/gloo.log"
