#!/usr/bin/env bash
# Issue #18, second H200 run: the O(1) non-finite flag. Sampling and graph tests, sanitizers on
# the new test, then old (efa5fe8) against new, in turns, slice3 FULL decode.
set -uo pipefail
mkdir -p .gpu/old
tar -C .gpu -xJf .gpu/pack/bundle.tar.xz
tar -C .gpu/old -xJf .gpu/pack/old.tar.xz
export OUT=${OUT:-gpu-logs} DSV4_TEST_DATA_DIR=$PWD/tests/data
B=.gpu/bundle
rc=0
bash $B/run.sh tests/dsv4_gpu_tests --gtest_filter='CudaModel.Worker*:CudaGraphs.*' > $OUT/gpu_tests.log 2>&1 || rc=1
grep -E "OK \]|FAILED|PASSED" $OUT/gpu_tests.log | tail -16
MEMCHECK_FILTER='CudaModel.WorkerFlagsNonFinite*:CudaModel.WorkerSampling*' \
RACECHECK_FILTER='CudaModel.WorkerFlagsNonFinite*' \
  bash scripts/device/sanitize.sh > $OUT/sanitize_summary.txt 2>&1 || rc=1
cat $OUT/sanitize_summary.txt
S3=tests/data/configs/dsv4-flash-slice3.json
one() {
  local b=$1; shift
  echo "== $b"
  timeout 150 bash $b/run.sh node/dsv4-node bench --device cuda --log-level warning \
    --synthetic-config "$S3" --batches 1,8,256 --contexts 4096 --decode-steps 32 \
    --cudagraph-mode full_and_piecewise --cudagraph-capture-sizes 1,2,4,8,16,32,64,128,256 \
    --overlap-steps on 2>&1 | grep -E "^ +[0-9]+ +4096"
}
{ for round in 1 2 3; do one .gpu/old/bundle; one .gpu/bundle; done; } 2>&1 | tee $OUT/ab_sampling.log
exit $rc
