#!/usr/bin/env bash
# promtool check + unit tests of deploy/k8s/prometheus-rules.yaml.
#   check_rules.sh SOURCE_DIR
set -euo pipefail
SRC=$1
. "$SRC/deploy/tests/lib.sh"
need promtool
need node
need_node_modules
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
node "$SRC/deploy/validate/extract-rules.mjs" "$SRC/deploy/k8s/prometheus-rules.yaml" \
    "$TMP/prometheus-rules.groups.yaml"
promtool check rules "$TMP/prometheus-rules.groups.yaml"
cp "$SRC/deploy/k8s/prometheus-rules.test.yaml" "$TMP/"
promtool test rules "$TMP/prometheus-rules.test.yaml"
