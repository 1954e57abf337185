#!/bin/bash
# On the H200 host: the TF32 indexer scoring and precision fp8 (FP8 activations from 128 rows)
# checks, slice3 TTFT in precision bf16 (TF32 indexer on, and off: DSV4_INDEXER_TF32=0) against
# fp8 at 1k, 8k and 32k, the 32k op profile, and per-kernel times of the 8k boundaries and the
# indexer under ncu. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
S3=tests/data/configs/dsv4-flash-slice3.json
SECONDS=0
timeout 240 $R tests/dsv4_gpu_tests --gtest_filter='CudaOps.IndexerTopK*:CudaFp8Linear.Fp8Activations*:CudaModel.QuantizedFixture*:CudaMoeTiled.Ragged*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^\[ *(OK|FAILED|PASSED) |Failure|error|Expected|Which is|p50=|agreement|swaps" "$OUT/tests.log" | head -60
bench() { timeout 120 $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 2 "$@" 2>&1; }
for len in 8192 1024; do
  echo "== prompt $len bf16 DSV4_INDEXER_TF32=0"
  DSV4_INDEXER_TF32=0 bench --precision bf16 --prompt-len $len --repeats 3 | grep -E -A2 "^ batch|error" | tail -3
  for p in bf16 fp8; do
    echo "== prompt $len $p"
    bench --precision $p --prompt-len $len --repeats 3 | grep -E -A2 "^ batch|error" | tail -3
  done
done
echo "== prompt 32768 bf16 DSV4_INDEXER_TF32=0"
DSV4_INDEXER_TF32=0 bench --precision bf16 --prompt-len 32768 --repeats 1 | grep -E -A2 "^ batch|error" | tail -3
echo "== prompt 32768 fp8 (profile)"
DSV4_PROFILE_OPS=1 bench --precision fp8 --prompt-len 32768 --repeats 1 > "$OUT/profile32k.log"
grep -E -A2 "^ batch" "$OUT/profile32k.log" | tail -3
grep -A30 "^op profile" "$OUT/profile32k.log" | head -32
echo "benches at ${SECONDS}s"
echo "== ncu 8k fp8"
timeout 200 ncu --clock-control none --target-processes all --kernel-name regex:'MixKernel|HcFinal|HcGates|ScoreMma|ScoreKernel|SelectKernel|HcPostVec|CombineAssign|QuantizeFp8|ExpertWgmma' --launch-count 40 --metrics gpu__time_duration.sum --csv $R node/dsv4-node bench --device cuda --log-level warning --synthetic-config $S3 --weight-format auto --batches 1 --contexts 0 --decode-steps 1 --prompt-len 8192 --repeats 1 --precision fp8 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?"; grep -E '"gpu__time' "$OUT/ncu.csv" | awk -F'","' '{print $5, $(NF)}' | sed 's/(.*)//' | cut -c1-150 | head -45
echo "done at ${SECONDS}s"
