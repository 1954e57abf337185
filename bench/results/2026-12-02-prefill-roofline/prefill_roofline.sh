#!/bin/bash
# On the H200 host: the prefill rows of `dsv4-node bench` with their roofline line (step_cost.h):
# the 3-layer Flash slice, batch 1, prompts of 1k and 8k tokens, weights as released (FP8 + MXFP4)
# and dequantised to bf16.
#   bash prefill_roofline.sh   (from the repository root, with the bundle in .gpu/bundle)
set -uo pipefail
B="bash .gpu/bundle/run.sh node/dsv4-node"
for fmt in auto bf16; do
  for p in 1024 8192; do
    echo "== weight_format=$fmt prompt_len=$p"
    $B bench --synthetic-config tests/data/configs/dsv4-flash-slice3.json --weight-format $fmt \
      --batches 1 --prompt-len $p --decode-steps 8 --repeats 3 2>&1 | grep -A2 "^ batch"
  done
done
