#!/usr/bin/env bash
# yamllint over deploy/, kustomize rendering of every root, offline schema and cross-resource
# validation of the rendered manifests, and negative cases that must be rejected.
# With the binary, every flag the pod templates pass must be one the binary accepts.
#   check_manifests.sh SOURCE_DIR [DSV4_NODE_BINARY]
set -euo pipefail
SRC=$1
BIN=${2:-}
. "$SRC/deploy/tests/lib.sh"
need yamllint
need node
need_node_modules
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
yamllint -c "$SRC/deploy/.yamllint" "$SRC/deploy"
echo "yamllint: ok"
V="$SRC/deploy/validate/validate.mjs"
if command -v kubectl >/dev/null; then
  for root in "" overlays/single-node-tp2 overlays/multi-node-lws overlays/cpu-dev; do
    out="$TMP/render-${root//\//_}.yaml"
    kubectl kustomize "$SRC/deploy/k8s/$root" > "$out"
    node "$V" "$out"
  done
else
  echo "kubectl not installed: validating the resource files without kustomize rendering"
  node "$V" "$SRC"/deploy/k8s/base/{configmap,service,pdb,servicemonitor}.yaml \
      "$SRC/deploy/k8s/overlays/single-node-tp2/statefulset.yaml"
  node "$V" "$SRC"/deploy/k8s/base/{configmap,service,pdb,servicemonitor}.yaml \
      "$SRC/deploy/k8s/overlays/multi-node-lws/leaderworkerset.yaml"
  node "$V" "$SRC/deploy/k8s/prometheus-rules.yaml"
fi
for bad in "$SRC"/deploy/validate/testdata/bad-*.yaml; do
  if node "$V" "$bad" > "$TMP/out" 2>&1; then
    echo "FAIL: $bad was accepted"; cat "$TMP/out"; exit 1
  fi
  echo "rejected as expected: $(basename "$bad"): $(grep -m1 FAIL "$TMP/out")"
done
if [ -n "$BIN" ]; then
  node "$SRC/deploy/validate/flags.mjs" "$SRC"/deploy/k8s/overlays/*/*.yaml > "$TMP/flags"
  while read -r cmd flag; do
    if [ "$cmd" = "-" ]; then "$BIN" --help > "$TMP/help" 2>&1 || true
    else "$BIN" "$cmd" --help > "$TMP/help" 2>&1 || true; fi
    if ! grep -q -- "$flag" "$TMP/help"; then
      echo "FAIL: the manifests pass '$flag' to '$cmd', which dsv4-node does not accept"; exit 1
    fi
  done < "$TMP/flags"
  echo "flags: $(wc -l < "$TMP/flags") manifest flags accepted by $BIN"
fi
