#!/bin/bash
# On the H200 host (from the repository root, bundle in .gpu/bundle): the tiled expert GEMMs'
# tests, then slice3 prefill with them (DSV4_MOE_TILED=1, by shape) against the decode-shaped
# expert kernels (DSV4_MOE_TILED=0) in one call, with the per-op GPU time of the prefill steps.
set -uo pipefail
export DSV4_TEST_DATA_DIR=$PWD/tests/data
R="bash .gpu/bundle/run.sh"
CFG=tests/data/configs/dsv4-flash-slice3.json
echo "== prefill GEMM lab (bench/lab/prefill_gemm_lab.cu, in .gpu/lab)"
timeout 90 $R ../lab/prefill_gemm_lab all 2>&1 | tail -30
timeout 200 $R tests/dsv4_gpu_tests --gtest_filter='CudaMoeTiled*:CudaMoeQuant*:CudaOps.*Moe*:CudaOps.*Expert*' 2>&1 | grep -E "^\[ *(OK|FAILED|PASSED|RUN) |max_abs|Failure|error|expected|Which is" | head -120
for fmt in auto bf16; do
  for tiled in 0 1; do
    for p in 1024 8192; do
      echo "== weight_format=$fmt DSV4_MOE_TILED=$tiled prompt_len=$p"
      DSV4_MOE_TILED=$tiled timeout 120 $R node/dsv4-node bench --synthetic-config $CFG --weight-format $fmt \
        --batches 1 --prompt-len $p --decode-steps 4 --repeats 3 2>&1 | grep -A2 "^ batch"
    done
  done
done
echo "== profile: auto, 8192, tiled 1 then 0"
for tiled in 1 0; do
  DSV4_PROFILE_OPS=1 DSV4_MOE_TILED=$tiled timeout 120 $R node/dsv4-node bench --synthetic-config $CFG --weight-format auto \
    --batches 1 --prompt-len 8192 --decode-steps 1 --repeats 1 2>&1 | tail -40
done
echo "== variants, auto weights"
for v in "DSV4_MOE_TILE_WARPS=4 8192" "DSV4_MOE_TILED=128 8192" "DSV4_MOE_TILED=64 1024" "DSV4_MOE_TILED=64 DSV4_MOE_TILE_WARPS=4 1024"; do
  p=${v##* }; envs=${v% *}
  echo "-- $envs prompt_len=$p"
  env $envs timeout 120 $R node/dsv4-node bench --synthetic-config $CFG --weight-format auto \
    --batches 1 --prompt-len $p --decode-steps 4 --repeats 3 2>&1 | grep -A2 "^ batch"
done
