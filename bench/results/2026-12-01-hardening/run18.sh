#!/usr/bin/env bash
# Issue #18 on the H200: GPU suite + serving suite (tests.sh), sanitizers on the sampling
# kernels, and the decode step of the commit before (old) against this one (new), in turns.
set -uo pipefail
mkdir -p .gpu/old
tar -C .gpu -xJf .gpu/pack/bundle.tar.xz
tar -C .gpu/old -xJf .gpu/pack/old.tar.xz
export OUT=${OUT:-gpu-logs}
rc=0
bash scripts/device/tests.sh > $OUT/tests_summary.txt 2>&1 || rc=1
grep -E "PASSED|FAILED|SKIPPED \]" $OUT/gpu_tests.log $OUT/server_cuda_*.log | tail -20
MEMCHECK_FILTER='CudaModel.WorkerFlagsNonFinite*:CudaModel.WorkerSampling*' \
RACECHECK_FILTER='CudaModel.WorkerFlagsNonFinite*:CudaModel.WorkerSampling*' \
  bash scripts/device/sanitize.sh > $OUT/sanitize_summary.txt 2>&1 || rc=1
cat $OUT/sanitize_summary.txt
S3=tests/data/configs/dsv4-flash-slice3.json
one() {
  local b=$1; shift
  echo "== $b"
  timeout 150 bash $b/run.sh node/dsv4-node bench --device cuda --log-level warning \
    --synthetic-config "$S3" --batches 1,8,256 --contexts 4096 --decode-steps 32 \
    --cudagraph-mode full_and_piecewise --cudagraph-capture-sizes 1,2,4,8,16,32,64,128,256 \
    --overlap-steps on 2>&1 | grep -E "^ +[0-9]+ +4096|batch"
}
{ for round in 1 2 3; do one .gpu/old/bundle; one .gpu/bundle; done; } 2>&1 | tee $OUT/ab_sampling.log
exit $rc
