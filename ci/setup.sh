#!/usr/bin/env bash
# Install what gdnkit needs on Debian 12 (idempotent: does nothing when all is there).
# CUDA comes with the machine (/usr/local/cuda); everything else is Debian's.
# clang-19 builds the HIP backend's AMD code objects, gfx942 (MI300) included;
# clang-15 alone would build gfx908 and gfx90a only.
set -euo pipefail

packages=(cmake ninja-build g++ libgtest-dev libbenchmark-dev nlohmann-json3-dev python3-numpy
          hipcc libamdhip64-dev rocm-device-libs clang-15 lld-15 libtrilinos-kokkos-dev
          clang-19 lld-19 llvm-19 clang-tools-19 libclang-rt-19-dev
          python3-dev python3-venv)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "ci/setup.sh: all ${#packages[@]} packages present"
  exit 0
fi

echo "ci/setup.sh: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
