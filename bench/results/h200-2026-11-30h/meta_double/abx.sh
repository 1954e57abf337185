#!/usr/bin/env bash
# Side by side on one machine: prev (one metadata buffer, uploaded on the main stream) against new
# (two buffers, the upload on a copy stream overlapping the previous step). Overlap on.
set -uo pipefail
S3=tests/data/configs/dsv4-flash-slice3.json
one() {
  local b=$1; shift
  echo "== $b $*"
  env "$@" DSV4_STEP_DEVICE_TIME=1 timeout 120 bash $b/run.sh node/dsv4-node bench --device cuda \
    --log-level warning --synthetic-config "$S3" --batches 1,8,64 --contexts 4096 --decode-steps 32 \
    --cudagraph-mode none,full_and_piecewise --cudagraph-capture-sizes 1,2,4,8,16,32,64 --overlap-steps on 2>&1 |
    grep -E "^ +[0-9]+ +4096|per-step medians|cudagraph_mode"
}
for round in 1 2 3; do
  one .gpu/prev/bundle X=0
  one .gpu/bundle X=0
done
