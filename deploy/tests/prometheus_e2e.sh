#!/usr/bin/env bash
# End to end on loopback: dsv4-node and a real Prometheus server (Debian's) scraping it every
# second with our rules loaded (evaluated every second; alert `for:` shortened to 0s). Sends
# forced runaways (chat with thinking on, max_tokens 4) and normal requests (stopped by a stop
# token), then polls the Prometheus HTTP API until Dsv4LengthCapRunawaysHigh fires and the recorded
# runaway ratio equals what was sent. Bounded: 120 s.
#   prometheus_e2e.sh DSV4_NODE_BINARY SOURCE_DIR
set -euo pipefail
BIN=$1; SRC=$2
. "$SRC/deploy/tests/lib.sh"
need prometheus
need curl
need python3
need node
need_node_modules
TMP=$(mktemp -d)
PROM_PID=""
cleanup() {
  [ -n "$PROM_PID" ] && kill -TERM "$PROM_PID" 2>/dev/null && wait "$PROM_PID" 2>/dev/null
  stop_node || true
  rm -rf "$TMP"
}
trap cleanup EXIT
start_node
node "$SRC/deploy/validate/extract-rules.mjs" "$SRC/deploy/k8s/prometheus-rules.yaml" \
    "$TMP/rules.yaml" --for 0s --interval 1s
PROM_PORT=$(free_port)
cat > "$TMP/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $TMP/rules.yaml
scrape_configs:
  - job_name: dsv4-node
    static_configs:
      - targets: ["127.0.0.1:$METRICS_PORT"]
YAML
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn > "$TMP/prometheus.log" 2>&1 &
PROM_PID=$!
API="http://127.0.0.1:$PROM_PORT/api/v1"
query() { curl -sf --get --data-urlencode "query=$1" "$API/query"; }
value() {  # first sample value of an instant query, or "none"
  query "$1" | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "none")'
}
deadline=$((SECONDS + 120))
until [ "$(value 'up{job="dsv4-node"}' 2>/dev/null)" = "1" ]; do
  [ $SECONDS -lt $deadline ] || { echo "Prometheus never scraped the node"; cat "$TMP/prometheus.log"; exit 1; }
  sleep 0.5
done
sleep 2.5   # a few zero-valued scrapes before the traffic, so rates see every request
RUNAWAYS=4; NORMAL=4
for i in $(seq 1 $RUNAWAYS); do
  "$BIN" client --target "127.0.0.1:$GRPC_PORT" --chat "Think about question $i." --thinking \
      --max-tokens 4 >/dev/null 2>&1
done
for i in $(seq 1 $NORMAL); do
  # p0 of the fixture: its first greedy token is 37, so this stops at once (STOP, content).
  "$BIN" client --target "127.0.0.1:$GRPC_PORT" --prompt-ids 263,1015,148,447,146 \
      --stop-token-id 37 --max-tokens 8 >/dev/null 2>&1
done
EXPECT=$(python3 -c "print($RUNAWAYS / ($RUNAWAYS + $NORMAL))")
echo "sent $RUNAWAYS runaways and $NORMAL normal requests; expected ratio $EXPECT"
firing=""; ratio=""
while [ $SECONDS -lt $deadline ]; do
  ratio=$(value 'dsv4:runaway_ratio:rate5m{job="dsv4-node"}' 2>/dev/null || echo none)
  firing=$(curl -sf "$API/alerts" | python3 -c 'import json,sys
a=[x for x in json.load(sys.stdin)["data"]["alerts"] if x["labels"]["alertname"]=="Dsv4LengthCapRunawaysHigh"]
print(a[0]["state"] if a else "none")' 2>/dev/null || echo none)
  if [ "$firing" = "firing" ] && python3 -c "import sys; sys.exit(0 if abs(float('$ratio') - $EXPECT) < 1e-9 else 1)" 2>/dev/null; then
    break
  fi
  sleep 0.5
done
echo "alert Dsv4LengthCapRunawaysHigh: $firing; recorded dsv4:runaway_ratio:rate5m = $ratio"
[ "$firing" = "firing" ] || { echo "FAIL: the runaway alert did not fire"; exit 1; }
python3 -c "import sys; sys.exit(0 if abs(float('$ratio') - $EXPECT) < 1e-9 else 1)" ||
  { echo "FAIL: recorded ratio $ratio, sent $EXPECT"; exit 1; }
# The finish-reason mix agrees: half length/reasoning, half stop/content.
mix=$(value 'dsv4:finish_reason_mix:ratio_rate5m{job="dsv4-node",finish_reason="length",phase_at_finish="reasoning"}')
echo "recorded finish-reason mix length/reasoning = $mix"
python3 -c "import sys; sys.exit(0 if abs(float('$mix') - $EXPECT) < 1e-9 else 1)" ||
  { echo "FAIL: finish-reason mix $mix"; exit 1; }
kill -TERM "$PROM_PID"; wait "$PROM_PID" || true; PROM_PID=""
stop_node || { echo "FAIL: dsv4-node did not exit 0 after SIGTERM"; cat "$TMP/serve.log"; exit 1; }
echo "both stopped cleanly"
