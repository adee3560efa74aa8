#!/usr/bin/env bash
# Run on the Debian build machine: put what building the Python package needs on a
# GPU machine without Kokkos or nlohmann-json into .carry/py-sdk (ignored by git;
# name it in the device tool's `carry`). With --wheel, also build a cp312 wheel
# with CUDA (sm_90) here, as a fallback for a GPU machine that cannot build.
#
#   bash python/gpu/prepare_carry.sh [--wheel]
#
# Contents: include/trilinos (Kokkos headers), include/nlohmann, lib/libtrilinos_kokkoscore.so.13.2,
# lib/cmake/Kokkos/KokkosConfig.cmake (a relocatable stand-in for Debian's), share/cmake/nlohmann_json,
# python3.12/include (headers, used only if the GPU machine's Python lacks them), wheels/.
set -euo pipefail
cd "$(dirname "$0")/../.."
sdk=.carry/py-sdk
rm -rf "$sdk"
mkdir -p "$sdk/include" "$sdk/lib/cmake/Kokkos" "$sdk/share/cmake"

cp -r /usr/include/trilinos "$sdk/include/"
cp -r /usr/include/nlohmann "$sdk/include/"
cp -L /usr/lib/x86_64-linux-gnu/libtrilinos_kokkoscore.so.13.2 "$sdk/lib/"
cp -r /usr/share/cmake/nlohmann_json "$sdk/share/cmake/"
cat > "$sdk/lib/cmake/Kokkos/KokkosConfig.cmake" <<'CFG'
# Stand-in for Debian's Kokkos package config: headers and the core library carried
# next to this file (python/gpu/prepare_carry.sh). Serial backend, as Debian builds it.
get_filename_component(_gdn_sdk "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET Kokkos::kokkos)
  add_library(Kokkos::kokkos SHARED IMPORTED)
  set_target_properties(Kokkos::kokkos PROPERTIES
    IMPORTED_LOCATION "${_gdn_sdk}/lib/libtrilinos_kokkoscore.so.13.2"
    IMPORTED_SONAME "libtrilinos_kokkoscore.so.13.2"
    INTERFACE_INCLUDE_DIRECTORIES "${_gdn_sdk}/include/trilinos")
endif()
set(Kokkos_INCLUDE_DIRS "${_gdn_sdk}/include/trilinos")
set(Kokkos_VERSION 3.4.1)
set(Kokkos_FOUND TRUE)
CFG

py312=${PY312:-}
if [ -z "$py312" ]; then  # a working Python 3.12 (the GPU machine's version), if any
  for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      py312=$c
      break
    fi
  done
fi
if [ -n "$py312" ]; then
  inc=$("$py312" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  mkdir -p "$sdk/python3.12"
  cp -r "$inc" "$sdk/python3.12/include"
fi

if [ "${1:-}" = "--wheel" ]; then
  [ -n "$py312" ] || { echo "--wheel needs python3.12" >&2; exit 1; }
  venv=build-python/venv312
  [ -x "$venv/bin/python" ] || "$py312" -m venv "$venv"
  "$venv/bin/pip" install -q scikit-build-core nanobind
  CMAKE_ARGS="-DGDNKIT_ENABLE_CUDA=ON -DGDNKIT_ENABLE_HIP=OFF -DGDNKIT_CUDA_ARCHITECTURES=90-real \
-DGDNKIT_PYTHON_BUNDLE=$PWD/$sdk/lib/libtrilinos_kokkoscore.so.13.2" \
    "$venv/bin/pip" wheel --no-build-isolation --no-deps -w "$sdk/wheels" \
    --config-settings=build-dir="build-python/gpu-{wheel_tag}" .
fi
du -sh "$sdk"
