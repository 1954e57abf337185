#!/bin/bash
# The long fuzz run of 2026-12-01 (issue #18): each target for FUZZ_SECONDS (480) on one core,
# from the seeds in tests/fuzz/corpus, in a scratch directory. Logs: <target>.log.
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
B=$ROOT/build-fuzz/tests
C=$ROOT/tests/fuzz/corpus
cd "${FUZZ_DIR:-$(mktemp -d)}"
for t in safetensors_header:safetensors config:config tokenizer:tokenizer request:request; do
  name=${t%%:*}; seeds=${t##*:}
  rm -rf work_$name; mkdir -p work_$name; cp $C/$seeds/* work_$name/
  extra=""
  [ $name = tokenizer ] && extra="-max_len=65536"
  ( time $B/${name}_fuzzer work_$name -max_total_time=${FUZZ_SECONDS:-480} -rss_limit_mb=3072 -print_final_stats=1 $extra ) > $name.log 2>&1
  echo "$name rc=$?" >> summary.txt
done
