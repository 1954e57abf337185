#!/usr/bin/env bash
# Side by side on one machine: three builds of the GPU worker (old: copy-back kernel; mid: + rows
# with the metadata; new: + the copy as the FULL graph's last node). FULL graphs, overlap on.
set -uo pipefail
S3=tests/data/configs/dsv4-flash-slice3.json
one() {
  local b=$1; shift
  echo "== $b $*"
  env "$@" DSV4_STEP_DEVICE_TIME=1 timeout 120 bash $b/run.sh node/dsv4-node bench --device cuda \
    --log-level warning --synthetic-config "$S3" --batches 1,8 --contexts 4096 --decode-steps 32 \
    --cudagraph-mode full_and_piecewise --cudagraph-capture-sizes 1,2,4,8 --overlap-steps on 2>&1 |
    grep -E "^ +[0-9]+ +4096|per-step medians"
}
for round in 1 2 3; do
  one .gpu/old/bundle X=0
  one .gpu/mid/bundle X=0
  one .gpu/bundle X=0
done
