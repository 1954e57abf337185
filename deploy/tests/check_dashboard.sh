#!/usr/bin/env bash
# The Grafana dashboard is well formed, every expression in it parses (promtool), and every metric
# the dashboard and the alert rules read exists in the live exposition of a running node. The node
# serves the HTTP API too and answers it once (GET /health until 200, then GET /v1/models): the
# dsv4_http_responses_total family has no series, and so no TYPE line, before its first answer.
#   check_dashboard.sh DSV4_NODE_BINARY SOURCE_DIR
set -euo pipefail
BIN=$1; SRC=$2
. "$SRC/deploy/tests/lib.sh"
need promtool
need node
need curl
need_node_modules
TMP=$(mktemp -d); trap 'stop_node || true; rm -rf "$TMP"' EXIT
node "$SRC/deploy/validate/dashboard.mjs" "$SRC/deploy/grafana/dsv4-node.json" \
    "$SRC/deploy/k8s/prometheus-rules.yaml" "$TMP/dashboard-rules.yaml" "$TMP/metrics-used.txt"
promtool check rules "$TMP/dashboard-rules.yaml"
start_node --http-listen 127.0.0.1:0
[ "$HTTP_PORT" != 0 ] || { echo "the node reported no HTTP port"; cat "$TMP/ports"; exit 1; }
for _ in $(seq 1 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HTTP_PORT/health")" = 200 ] && break
  sleep 0.1
done
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HTTP_PORT/v1/models")
[ "$code" = 200 ] || { echo "GET /v1/models answered $code"; cat "$TMP/serve.log"; exit 1; }
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" > "$TMP/exposition.txt"
# The labels the HTTP panels and the alert select on.
grep -qE '^dsv4_http_responses_total\{(.*code="200".*endpoint="/v1/models"|.*endpoint="/v1/models".*code="200")' "$TMP/exposition.txt" ||
  { echo "MISSING from /metrics: dsv4_http_responses_total{code=\"200\",endpoint=\"/v1/models\"}"; exit 1; }
missing=0
while read -r m; do
  if ! grep -q "^# TYPE $m " "$TMP/exposition.txt"; then echo "MISSING from /metrics: $m"; missing=1; fi
done < "$TMP/metrics-used.txt"
[ $missing -eq 0 ] || exit 1
echo "all $(wc -l < "$TMP/metrics-used.txt") metric families used by the dashboard and rules are exported"
stop_node
