#!/usr/bin/env bash
# End-to-end tests of the OpenAI-compatible HTTP API with the official openai SDK
# (tests/openai_client). Starts `dsv4-node serve` on loopback (ephemeral gRPC, metrics and HTTP
# ports) and runs sdk_test.js, hostile_test.js and load_test.js against it; then, given a scripted
# test node (a fake model that plays tests/openai_client/scripts.json), runs `sdk_test.js
# --scripted` against that; then a node with --api-key-file (requests without the key get 401).
# Every node must exit 0 on SIGTERM.
#   openai_test.sh DSV4_NODE_BINARY SOURCE_DIR [SCRIPTED_NODE_BINARY]
set -u
BIN=$1; SRC=$2; SCRIPTED=${3:-}
command -v node >/dev/null || { echo "node not installed: skipping"; exit 77; }
T="$SRC/tests/openai_client"
[ -d "$T/node_modules/openai" ] ||
  { echo "tests/openai_client/node_modules missing (run scripts/setup.sh)"; exit 1; }
[ -d "$SRC/tests/node_client/node_modules/@grpc/grpc-js" ] ||
  { echo "tests/node_client/node_modules missing (run scripts/setup.sh)"; exit 1; }
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null
TMP=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
FAILED=0

# start NAME BINARY ARGS...: starts a node writing its ports to $TMP/NAME.ports; sets PID, GRPC,
# METRICS, HTTP_PORT.
start() {
  local name=$1 bin=$2; shift 2
  rm -f "$TMP/$name.ports"
  "$bin" "$@" --port-file "$TMP/$name.ports" > "$TMP/$name.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 300); do grep -q '"http"' "$TMP/$name.ports" 2>/dev/null && break; sleep 0.1; done
  if ! grep -q '"http"' "$TMP/$name.ports" 2>/dev/null; then
    echo "$name node did not start (no \"http\" port in its port file)"; cat "$TMP/$name.log"
    kill -9 "$PID" 2>/dev/null; PID=; exit 1
  fi
  port() { sed -nE "s/.*\"$1\": *([0-9]+).*/\1/p" "$TMP/$name.ports"; }
  GRPC=$(port grpc); METRICS=$(port metrics); HTTP_PORT=$(port http)
  echo "$name node: pid $PID, http $HTTP_PORT, grpc ${GRPC:-none}, metrics ${METRICS:-none}"
}

# stop NAME: SIGTERM, wait up to 30 s, require exit status 0.
stop() {
  local name=$1 waited=0
  kill -TERM "$PID"
  while kill -0 "$PID" 2>/dev/null && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited+1)); done
  if kill -0 "$PID" 2>/dev/null; then
    echo "FAIL $name node did not exit after SIGTERM"; kill -9 "$PID"; PID=; FAILED=1; return
  fi
  wait "$PID"; local rc=$?
  PID=
  if [ $rc -ne 0 ]; then echo "FAIL $name node exited $rc after SIGTERM"; cat "$TMP/$name.log"; FAILED=1
  else echo "ok   $name node exited 0 after SIGTERM"; fi
}

# run WHAT COMMAND...: runs one test program, records a failure.
run() {
  local what=$1; shift
  echo "== $what"
  "$@"; local rc=$?
  if [ $rc -ne 0 ]; then echo "FAIL $what (rc $rc)"; FAILED=1; else echo "ok   $what"; fi
}

FLAGS=(--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log-level warning)

# 1. The real node (the embedded dsv4-tiny model). 256 concurrent streams come from one client.
start real "$BIN" serve "${FLAGS[@]}" --max-model-len 1024 --max-requests-per-client 1024
URL="http://127.0.0.1:$HTTP_PORT"
run "sdk_test.js" env DSV4_GRPC="127.0.0.1:$GRPC" DSV4_METRICS="127.0.0.1:$METRICS" \
    timeout 120 node "$T/sdk_test.js" "$URL"
run "hostile_test.js" timeout 120 node "$T/hostile_test.js" "$URL"
run "load_test.js" timeout 150 node "$T/load_test.js" "$URL" "127.0.0.1:$METRICS" "$PID"
stop real

# 2. The scripted test node (a binary of its own: no `serve` subcommand). --max-model-len 4096: with
#    the tiny tokenizer the tools block alone is ~620 tokens and the longest script ~390.
if [ -n "$SCRIPTED" ]; then
  start scripted "$SCRIPTED" "${FLAGS[@]}" --max-model-len 4096 --scripts "$T/scripts.json"
  run "sdk_test.js --scripted" timeout 120 node "$T/sdk_test.js" "http://127.0.0.1:$HTTP_PORT" --scripted
  stop scripted
else
  echo "no scripted node binary given: skipping sdk_test.js --scripted"
fi

# 3. A node with an API key.
KEY="k-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
printf '%s\n' "$KEY" > "$TMP/api-key"
chmod 600 "$TMP/api-key"
start keyed "$BIN" serve "${FLAGS[@]}" --max-model-len 1024 --api-key-file "$TMP/api-key"
URL="http://127.0.0.1:$HTTP_PORT"
run "sdk_test.js with an API key" env DSV4_API_KEY="$KEY" DSV4_GRPC="127.0.0.1:$GRPC" \
    DSV4_METRICS="127.0.0.1:$METRICS" timeout 120 node "$T/sdk_test.js" "$URL"
run "requests without the key get 401" node -e '
  const url = process.argv[1];
  const body = JSON.stringify({ model: "dsv4-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 1 });
  (async () => {
    let bad = 0;
    for (const [what, path, init] of [
        ["GET /v1/models without a key", "/v1/models", {}],
        ["POST /v1/chat/completions without a key", "/v1/chat/completions",
         { method: "POST", headers: { "Content-Type": "application/json" }, body }],
        ["POST /v1/chat/completions with a wrong key", "/v1/chat/completions",
         { method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer wrong" }, body }]]) {
      const r = await fetch(url + path, init);
      const j = await r.json().catch(() => null);
      const ok = r.status === 401 && j && j.error && j.error.code === "invalid_api_key";
      console.log(`${ok ? "ok  " : "FAIL"} ${what} -> ${r.status} ${JSON.stringify(j)}`);
      if (!ok) bad++;
    }
    process.exit(bad ? 1 : 0);
  })();' "$URL"
stop keyed

[ $FAILED -eq 0 ] && echo "openai_test: all passed" || echo "openai_test: FAILED"
exit $FAILED
