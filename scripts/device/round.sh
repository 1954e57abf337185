#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): one kernel round in one call. The GPU suite, the graph
# benchmark of docs/cuda-graphs.md (scripts/device/graph_bench.sh: every mode, slice3 and Flash
# cut to 9 layers, transformers), slice3 batch 1 and 8 without programmatic dependent launch
# (DSV4_PDL=0, through scripts/device/ab.sh) for the side-by-side, Nsight Compute's per-kernel
# table of one eager batch-1 step, and the serving suite on the GPU worker (fp32, bf16). Logs go
# to $OUT.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
export DSV4_TEST_DATA_DIR=$PWD/tests/data
rc=0
timeout 200 bash $B/run.sh tests/dsv4_gpu_tests > "$OUT/gpu_tests.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/gpu_tests.log"
timeout 260 bash scripts/device/graph_bench.sh > /dev/null 2>&1 || rc=1
grep -A6 "slice3 decode" "$OUT/graph_bench.log" | head -20
echo "== slice3 DSV4_PDL=0"
AB_VAR=DSV4_PDL AB_VALUES=0 AB_ROUNDS=1 bash scripts/device/ab.sh > /dev/null 2>&1 || rc=1
mv "$OUT/ab.log" "$OUT/slice3_nopdl.log"
grep -E "^ +[18] " "$OUT/slice3_nopdl.log"
timeout 100 bash scripts/device/ncu_step.sh > /dev/null 2>&1 || rc=1
rm -f "$OUT/ncu.csv" "$OUT/dsv4-flash-9l.json"
[ -s "$OUT/ncu.err" ] || rm -f "$OUT/ncu.err"
tail -3 "$OUT/ncu_step.txt"
for p in fp32 bf16; do
  DSV4_TEST_DEVICE=cuda DSV4_TEST_PRECISION=$p timeout 60 bash $B/run.sh tests/dsv4_tests \
    --gtest_filter='Server*' > "$OUT/server_cuda.tmp" 2>&1
  { echo "== $p"; cat "$OUT/server_cuda.tmp"; } >> "$OUT/server_cuda.log"
  grep -E "^\[  (PASSED|FAILED) " "$OUT/server_cuda.tmp"
done
rm -f "$OUT/server_cuda.tmp"
exit $rc
