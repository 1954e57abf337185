# Helpers shared by the deploy tests (sourced).
need() { command -v "$1" >/dev/null || { echo "$1 not installed (scripts/setup.sh installs it)"; exit 1; }; }
need_node_modules() {
  [ -d "$SRC/deploy/validate/node_modules/js-yaml" ] ||
    { echo "deploy/validate/node_modules missing (run scripts/setup.sh)"; exit 1; }
}
# Starts `dsv4-node serve` on loopback; sets NODE_PID, GRPC_PORT, METRICS_PORT and HTTP_PORT (0
# unless the arguments pass --http-listen).
start_node() {
  "$BIN" serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --port-file "$TMP/ports" \
      --max-model-len 1024 --log-level warning "$@" > "$TMP/serve.log" 2>&1 &
  NODE_PID=$!
  for _ in $(seq 1 300); do [ -s "$TMP/ports" ] && break; sleep 0.1; done
  [ -s "$TMP/ports" ] || { echo "node did not start"; cat "$TMP/serve.log"; exit 1; }
  GRPC_PORT=$(sed -E 's/.*"grpc": ([0-9]+).*/\1/' "$TMP/ports")
  METRICS_PORT=$(sed -E 's/.*"metrics": ([0-9]+).*/\1/' "$TMP/ports")
  HTTP_PORT=$(sed -nE 's/.*"http": ([0-9]+).*/\1/p' "$TMP/ports")
  HTTP_PORT=${HTTP_PORT:-0}
}
stop_node() {
  [ -n "${NODE_PID:-}" ] || return 0
  kill -TERM "$NODE_PID" 2>/dev/null || true
  local rc=0
  wait "$NODE_PID" || rc=$?
  NODE_PID=""
  return $rc
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
