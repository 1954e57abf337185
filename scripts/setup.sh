#!/usr/bin/env bash
# Installs the Debian 12 packages dsv4-node builds and tests with. Idempotent: packages already
# present are skipped, and apt is not touched at all when nothing is missing.
# The CUDA toolkit is not a Debian package: when /usr/local/cuda/bin/nvcc exists the GPU plugin
# is built too, otherwise the build is CPU-only.
#   scripts/setup.sh                everything: build, tests, tools
#   scripts/setup.sh --build-only   what building the node needs (the container image uses this)
set -euo pipefail
BUILD_ONLY=0
[ "${1:-}" = "--build-only" ] && BUILD_ONLY=1

PACKAGES=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config git
  # libraries
  libopenblas-dev nlohmann-json3-dev libcli11-dev libabsl-dev libpcre2-dev
  libgtest-dev libgmock-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  # CPU ranks' collectives (parallel/gloo_communicator.h)
  libgloo-dev
  # HTTP listeners: Boost.Beast (header-only) with OpenSSL for TLS
  libboost-dev libssl-dev
)
if [ $BUILD_ONLY -eq 0 ]; then
  # Test tools: clang (fuzzers), promtool and a Prometheus server, yamllint, curl, openssl
  # (certificates for the TLS tests).
  PACKAGES+=(clang prometheus yamllint curl openssl)
  # Node.js runs the independent gRPC client and the manifest validation; use the machine's
  # node when it has one.
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    PACKAGES+=(nodejs npm)
  fi
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

[ $BUILD_ONLY -eq 1 ] && exit 0

# npm packages of the test tools (pinned by their package-lock.json files).
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for dir in tests/node_client tests/openai_client deploy/validate; do
  cd "$ROOT/$dir"
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
    npm ci --no-audit --no-fund --loglevel=error
    touch node_modules
  fi
done
