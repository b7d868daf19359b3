#!/usr/bin/env bash
# Regenerates cuda-sys/src/generated/*.rs from the CUDA 13.0 headers.
#
# Headers come from $CUDA_PATH/include when CUDA_PATH is set, otherwise from the
# NVIDIA Python wheels at the CUDA 13.0 (Update 2) versions below, unpacked into a cache
# folder (no pip install, nothing touches the system Python). libclang is installed with
# apt-get when missing. Running it twice gives no diff.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cublas==13.0.2.14
  nvidia-cusolver==12.0.4.66
  nvidia-cusparse==12.6.3.3
  nvidia-curand==10.4.0.35
  nvidia-cuda-profiler-api==13.0.85
  nvidia-nvtx==13.0.85
)

if [ -n "${CUDA_PATH:-}" ] && [ -f "$CUDA_PATH/include/cuda.h" ]; then
  INCLUDE="$CUDA_PATH/include"
else
  CACHE="${CUDA_SYS_HEADER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cuda-sys-headers-13.0}"
  INCLUDE="$CACHE/nvidia/cu13/include"
  if [ ! -f "$INCLUDE/cuda.h" ] || [ ! -f "$INCLUDE/cusparse.h" ]; then
    mkdir -p "$CACHE/wheels"
    python3 -m pip download --no-deps --only-binary=:all: -q -d "$CACHE/wheels" "${WHEELS[@]}"
    for w in "$CACHE"/wheels/*.whl; do
      python3 - "$w" "$CACHE" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if "/include/" in n])
PY
    done
  fi
fi

if [ -z "${LIBCLANG_PATH:-}" ]; then
  lib=$(ls /usr/lib/llvm-*/lib/libclang.so* 2>/dev/null | head -n 1 || true)
  if [ -z "$lib" ]; then
    apt-get update -qq && apt-get install -y -qq libclang-dev >/dev/null
    lib=$(ls /usr/lib/llvm-*/lib/libclang.so* | head -n 1)
  fi
  export LIBCLANG_PATH="$(dirname "$lib")"
fi

echo "headers: $INCLUDE"
CUDA_SYS_INCLUDE="$INCLUDE" cargo build -p cuda-rt-sys --features regenerate
echo "regenerated: cuda-sys/src/generated/"
git status --short cuda-sys/src/generated || true
