#!/usr/bin/env bash
# The Grafana dashboard is well formed, every expression in it parses (promtool), and every metric
# the dashboard and the alert rules read exists in the live exposition of a running node.
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
start_node
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" > "$TMP/exposition.txt"
missing=0
while read -r m; do
  if ! grep -q "^# TYPE $m " "$TMP/exposition.txt"; then echo "MISSING from /metrics: $m"; missing=1; fi
done < "$TMP/metrics-used.txt"
[ $missing -eq 0 ] || exit 1
echo "all $(wc -l < "$TMP/metrics-used.txt") metric families used by the dashboard and rules are exported"
stop_node
