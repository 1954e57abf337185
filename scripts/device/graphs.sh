#!/usr/bin/env bash
# On the GPU host (bundle in .gpu/bundle): the CUDA-graph checks. The graph regression tests, then
# the capture-short/replay-long test again with the debug switch that bakes the indexer shortcut
# into captured graphs (DSV4_DEBUG_INDEXER_SHORTCUT_IN_CAPTURE=1): that run must FAIL, which shows
# the test catches vLLM #52448. Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=.gpu/bundle
export DSV4_TEST_DATA_DIR=$PWD/tests/data
rc=0
bash $B/run.sh tests/dsv4_gpu_tests --gtest_filter='CudaGraphs.*' 2>&1 | tee "$OUT/graph_tests.log" || rc=1
if DSV4_DEBUG_INDEXER_SHORTCUT_IN_CAPTURE=1 bash $B/run.sh tests/dsv4_gpu_tests \
    --gtest_filter='CudaGraphs.CaptureShortReplayLongMatchesEager' > "$OUT/debug_switch.log" 2>&1; then
  echo "UNEXPECTED: the regression test passed with the shortcut baked into the graph" | tee -a "$OUT/debug_switch.log"
  rc=1
else
  echo "expected: the regression test fails with the debug switch on" | tee -a "$OUT/debug_switch.log"
fi
tail -5 "$OUT/debug_switch.log"
exit $rc
