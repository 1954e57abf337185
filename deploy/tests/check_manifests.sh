#!/usr/bin/env bash
# yamllint over deploy/, kustomize rendering of every root (and of every workload overlay with the
# optional components/api-key), offline schema and cross-resource validation of the rendered
# manifests, and negative cases that must be rejected (each for the reason its `# expect:` line
# names). With the binary, every flag the pod templates pass and every key of the ConfigMap flag
# files must be one the binary accepts, and the binary itself must parse each flag file.
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
# What the flag check reads: the rendered manifests, or the raw resource files without kubectl.
FLAG_SOURCES=("$SRC"/deploy/k8s/base/configmap.yaml "$SRC"/deploy/k8s/overlays/*/*.yaml)
if command -v kubectl >/dev/null; then
  FLAG_SOURCES=()
  for root in "" overlays/single-node-tp2 overlays/multi-node-lws overlays/cpu-dev; do
    out="$TMP/render-${root//\//_}.yaml"
    kubectl kustomize "$SRC/deploy/k8s/$root" > "$out"
    echo -n "${root:-.}: "; node "$V" "$out"
    FLAG_SOURCES+=("$out")
  done
  # The optional API key: each workload overlay with components/api-key, as a user's own
  # kustomization would add it (kustomize wants relative paths).
  for overlay in single-node-tp2 multi-node-lws cpu-dev; do
    dir="$TMP/api-key-$overlay"; mkdir -p "$dir"
    rel=$(realpath --relative-to="$dir" "$SRC/deploy/k8s")
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n' \
        "$rel/overlays/$overlay" "$rel/components/api-key" > "$dir/kustomization.yaml"
    out="$TMP/render-api-key-$overlay.yaml"
    kubectl kustomize "$dir" > "$out"
    if ! grep -q -- '--api-key-file=/etc/dsv4-node-api-key/api-key' "$out" || ! grep -q 'secretName: dsv4-node-api-key' "$out"; then
      echo "FAIL: components/api-key did not add --api-key-file and the Secret to $overlay"; exit 1
    fi
    echo -n "$overlay + components/api-key: "; node "$V" "$out"
    FLAG_SOURCES+=("$out")
  done
else
  echo "kubectl not installed: validating the resource files without kustomize rendering"
  L=(--labels-from "$SRC/deploy/k8s/base/kustomization.yaml")
  node "$V" "${L[@]}" "$SRC"/deploy/k8s/base/{configmap,service,pdb,servicemonitor}.yaml \
      "$SRC/deploy/k8s/overlays/single-node-tp2/statefulset.yaml"
  node "$V" "${L[@]}" "$SRC"/deploy/k8s/base/{configmap,service,pdb,servicemonitor}.yaml \
      "$SRC/deploy/k8s/overlays/multi-node-lws/leaderworkerset.yaml"
  node "$V" "$SRC/deploy/k8s/prometheus-rules.yaml"
fi
for bad in "$SRC"/deploy/validate/testdata/bad-*.yaml; do
  if node "$V" "$bad" > "$TMP/out" 2>&1; then
    echo "FAIL: $bad was accepted"; cat "$TMP/out"; exit 1
  fi
  expect=$(sed -n 's/^# expect: //p' "$bad" | head -n1)
  if [ -n "$expect" ] && ! grep -qF -- "$expect" "$TMP/out"; then
    echo "FAIL: $bad was rejected, but not for '$expect':"; cat "$TMP/out"; exit 1
  fi
  echo "rejected as expected: $(basename "$bad"): $(grep -m1 FAIL "$TMP/out")"
done
if [ -n "$BIN" ]; then
  node "$SRC/deploy/validate/flags.mjs" --configs "$TMP/configs" "${FLAG_SOURCES[@]}" > "$TMP/flags"
  while read -r cmd flag; do
    if [ "$cmd" = "-" ]; then "$BIN" --help > "$TMP/help" 2>&1 || true
    else "$BIN" "$cmd" --help > "$TMP/help" 2>&1 || true; fi
    # The whole flag as --help lists it ("  --flag TEXT", "-h,--help"), not a part of a longer one.
    if ! grep -qE -- "(^|[ ,])${flag}([ =]|\$)" "$TMP/help"; then
      echo "FAIL: the manifests pass '$flag' to '$cmd', which dsv4-node does not accept"; exit 1
    fi
  done < "$TMP/flags"
  echo "flags: $(wc -l < "$TMP/flags") manifest flags accepted by $BIN"
  # The binary parses each flag file (CLI11 reads --config before --help): a misspelt key or a
  # value out of range fails here as it would at the pod's start.
  n=0
  for cfg in "$TMP"/configs/*.toml; do
    [ -e "$cfg" ] || continue
    sub=$(sed -n 's/^\[\([a-z-]*\)\].*/\1/p' "$cfg" | head -n1)
    if ! "$BIN" --config "$cfg" "$sub" --help > "$TMP/help" 2>&1; then
      echo "FAIL: dsv4-node does not accept this flag file of the manifests:"; cat "$cfg"; tail -n2 "$TMP/help"; exit 1
    fi
    n=$((n + 1))
  done
  echo "flag files: $n ConfigMap flag files parsed by $BIN"
fi
