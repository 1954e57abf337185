# Sourced by the device scripts that serve and then load (needs $OUT and $B, the bundle).
# start_node ARGS...: `dsv4-node serve ARGS` on loopback ports with a port file; waits until the
# gRPC port is bound (the file holds -1 while the model loads) or the node exits, then sets
# NODE_PID, NODE_PORT and NODE_METRICS. Returns 1, the node stopped, if it never came up.
# stop_node: SIGTERM, then waits for the node's exit.
start_node() {
  rm -f "$OUT/port.json"
  bash "$B/run.sh" node/dsv4-node serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --port-file "$OUT/port.json" "$@" &
  NODE_PID=$!
  local bound='import json,sys; sys.exit(json.load(open(sys.argv[1]))["grpc"] <= 0)'
  for _ in $(seq 1800); do
    kill -0 "$NODE_PID" 2>/dev/null || break
    python3 -c "$bound" "$OUT/port.json" 2>/dev/null && break
    sleep 0.1
  done
  local read='import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(v); sys.exit(v <= 0)'
  if NODE_PORT=$(python3 -c "$read" "$OUT/port.json" grpc 2>/dev/null) &&
     NODE_METRICS=$(python3 -c "$read" "$OUT/port.json" metrics 2>/dev/null); then
    return 0
  fi
  echo "serve did not come up"
  kill "$NODE_PID" 2>/dev/null
  wait "$NODE_PID"
  return 1
}

stop_node() {
  kill -TERM "$NODE_PID"
  wait "$NODE_PID"
}
