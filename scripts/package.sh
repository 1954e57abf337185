#!/usr/bin/env bash
# Installs a built tree into a self-contained prefix (what the container image ships):
#   PREFIX/bin/dsv4-node
#   PREFIX/lib/dsv4-node/libdsv4_cuda.so          the GPU plugin (when built)
#   PREFIX/lib/*.so*                              non-system shared libraries (gRPC, absl, ...)
#   PREFIX/share/dsv4-node/models/dsv4-tiny/      the embedded tiny model
# CUDA libraries (cuBLAS, NCCL, the driver) and glibc/libstdc++ come from the runtime image.
#   scripts/package.sh BUILD_DIR PREFIX
set -euo pipefail
BUILD=$1; PREFIX=$2
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$PREFIX/bin" "$PREFIX/lib/dsv4-node" "$PREFIX/share/dsv4-node/models"
install -m 0755 "$BUILD/node/dsv4-node" "$PREFIX/bin/dsv4-node"
BINS=("$BUILD/node/dsv4-node")
if [ -f "$BUILD/worker/libdsv4_cuda.so" ]; then
  install -m 0755 "$BUILD/worker/libdsv4_cuda.so" "$PREFIX/lib/dsv4-node/libdsv4_cuda.so"
  BINS+=("$BUILD/worker/libdsv4_cuda.so")
fi
EXCLUDE='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libnvrtc|libnvJitLink)'
for b in "${BINS[@]}"; do ldd "$b"; done | awk '$2=="=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
while read -r name path; do
  [[ $name =~ $EXCLUDE ]] && continue
  cp -L "$path" "$PREFIX/lib/$name"
done
rm -rf "$PREFIX/share/dsv4-node/models/dsv4-tiny"
cp -rL "$SRC/models/dsv4-tiny" "$PREFIX/share/dsv4-node/models/dsv4-tiny"
echo "packaged into $PREFIX: $(ls "$PREFIX/lib" | wc -l) libraries, $(du -sh "$PREFIX" | cut -f1)"
