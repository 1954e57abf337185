#!/usr/bin/env bash
# Installs the Debian 12 packages dsv4-node builds and tests with. Idempotent: packages already
# present are skipped, and apt is not touched at all when nothing is missing.
# The CUDA toolkit is not a Debian package: when /usr/local/cuda/bin/nvcc exists the GPU plugin
# is built too, otherwise the build is CPU-only.
set -euo pipefail

PACKAGES=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config git clang
  # libraries
  libopenblas-dev nlohmann-json3-dev libcli11-dev libabsl-dev libpcre2-dev
  libgtest-dev libgmock-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  # test tools: promtool (and a Prometheus server for the end-to-end tests)
  prometheus curl
)
# Node.js runs the independent gRPC client tests; use the machine's node when it has one.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages of the Node.js test client (pinned by tests/node_client/package-lock.json).
cd "$(dirname "$0")/../tests/node_client"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  npm ci --no-audit --no-fund --loglevel=error
  touch node_modules
fi
