#!/usr/bin/env bash
# On the GPU host: compute-sanitizer memcheck (and racecheck on the custom kernels) over the
# kernel tests, at shapes that keep it under a few minutes. Logs go to $OUT (or ./gpu-logs).
# MEMCHECK_FILTER / RACECHECK_FILTER replace the test filters; INITCHECK_FILTER (unset: skipped)
# adds an initcheck run (reads of device memory nothing wrote).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
export DSV4_TEST_DATA_DIR=$PWD/tests/data
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
FILTER=${MEMCHECK_FILTER:-'CudaOps.RmsNorm*:CudaOps.Rope*:CudaOps.Embed*:CudaOps.Hyper*:CudaOps.Compress*:CudaOps.Indexer*:CudaOps.Attention*:CudaOps.Router*:CudaModel.Golden*:CudaModel.WorkerSampling*'}
RFILTER=${RACECHECK_FILTER:-'CudaOps.Compress*:CudaOps.Indexer*:CudaOps.Attention*:CudaModel.WorkerSampling*'}
rc=0
"$CS" --tool memcheck --target-processes all --error-exitcode 3 \
  bash $B/run.sh tests/dsv4_gpu_tests --gtest_filter="$FILTER" > "$OUT/memcheck.log" 2>&1 || rc=$?
tail -3 "$OUT/memcheck.log"
"$CS" --tool racecheck --target-processes all --error-exitcode 3 \
  bash $B/run.sh tests/dsv4_gpu_tests --gtest_filter="$RFILTER" \
  > "$OUT/racecheck.log" 2>&1 || rc=$?
tail -3 "$OUT/racecheck.log"
if [[ -n "${INITCHECK_FILTER:-}" ]]; then
  "$CS" --tool initcheck --target-processes all --error-exitcode 3 \
    bash $B/run.sh tests/dsv4_gpu_tests --gtest_filter="$INITCHECK_FILTER" \
    > "$OUT/initcheck.log" 2>&1 || rc=$?
  tail -3 "$OUT/initcheck.log"
fi
exit $rc
