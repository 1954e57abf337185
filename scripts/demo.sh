#!/usr/bin/env bash
# Runs the node on the embedded tiny model, streams a demo answer with `dsv4-node client`, then
# keeps serving until Ctrl-C (which drains and stops it). DSV4_DEMO_EXIT=1 stops after the demo.
#   DSV4_LISTEN (default 127.0.0.1:50051), DSV4_METRICS_LISTEN (default 127.0.0.1:9464),
#   DSV4_HTTP_LISTEN (the OpenAI-compatible API, default 127.0.0.1:8000)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/node/dsv4-node
LISTEN=${DSV4_LISTEN:-127.0.0.1:50051}
METRICS=${DSV4_METRICS_LISTEN:-127.0.0.1:9464}
HTTP=${DSV4_HTTP_LISTEN:-127.0.0.1:8000}
"$BIN" serve --listen "$LISTEN" --metrics-listen "$METRICS" --http-listen "$HTTP" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
"$BIN" client --target "$LISTEN" --wait-ready 120 --chat "What is the capital of France?" \
    --max-tokens 48
echo "dsv4-node is serving the embedded tiny model on $LISTEN (gRPC), http://$HTTP/v1 (OpenAI API)"
echo "and http://$METRICS/metrics."
if [ "${DSV4_DEMO_EXIT:-0}" = 1 ]; then exit 0; fi
echo "Try: $BIN client --target $LISTEN --prompt 'Hello' --json"
echo "     curl http://$HTTP/v1/chat/completions -d '{\"model\": \"dsv4-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 16}'"
echo "(Ctrl-C here stops the node)"
wait $PID
