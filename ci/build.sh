#!/usr/bin/env bash
# Configure and build gdnkit in build/ with every backend whose compiler is present.
# Usage: ci/build.sh [extra cmake args...]   (BUILD_DIR overrides build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
