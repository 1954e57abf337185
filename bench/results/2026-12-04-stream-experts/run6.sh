#!/bin/bash
# On the H200 host (one call): issue #20's loadgen table in fp8 with the step budget
# (--max-batched-tokens) at 1024 against the default 2048, 128 requests at 1-64 and 512 at 256,
# then at 1536. Logs in $OUT.
set -uo pipefail
export OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
SECONDS=0
LT_VAR=LT_MAX_BATCHED_TOKENS LT_VALUES="${RUN6_VALUES:-1024 2048 1536}" LT_PRECISION=fp8 LT_REQUESTS=128 timeout 420 bash scripts/device/loadgen_table.sh > /dev/null 2>&1
grep -vE "^\s*$" "$OUT/loadgen_table.log" | grep -vE "level=(info|warning)|^target" | tail -40
echo "done at ${SECONDS}s"
