#!/usr/bin/env bash
# Starts `dsv4-node serve` on loopback (ephemeral ports), runs the independent Node.js client
# against it, then sends SIGTERM and checks that the node drains and exits 0.
# The client asserts the fixture's greedy tokens, so a run with extra serve flags (a TP2 node:
# `--device cpu --tensor-parallel-size 2`) streams the same tokens or fails.
#   node_client_test.sh DSV4_NODE_BINARY SOURCE_DIR [SERVE_FLAG ...]
set -u
BIN=$1; SRC=$2; shift 2
command -v node >/dev/null || { echo "node not installed: skipping"; exit 77; }
[ -d "$SRC/tests/node_client/node_modules/@grpc/grpc-js" ] ||
  { echo "tests/node_client/node_modules missing (run scripts/setup.sh)"; exit 1; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$BIN" serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --port-file "$TMP/ports" \
    --max-model-len 1024 --log-level warning "$@" > "$TMP/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 300); do [ -s "$TMP/ports" ] && break; sleep 0.1; done
[ -s "$TMP/ports" ] || { echo "node did not start"; cat "$TMP/serve.log"; kill -9 $PID; exit 1; }
PORT=$(sed -E 's/.*"grpc": ([0-9]+).*/\1/' "$TMP/ports")
timeout 120 node "$SRC/tests/node_client/client_test.js" "127.0.0.1:$PORT"
RC=$?
kill -TERM $PID
WAITED=0
while kill -0 $PID 2>/dev/null && [ $WAITED -lt 300 ]; do sleep 0.1; WAITED=$((WAITED+1)); done
if kill -0 $PID 2>/dev/null; then echo "node did not exit after SIGTERM"; kill -9 $PID; exit 1; fi
wait $PID; SERVE_RC=$?
echo "client rc=$RC serve rc=$SERVE_RC"
[ $SERVE_RC -eq 0 ] || { cat "$TMP/serve.log"; exit 1; }
exit $RC
