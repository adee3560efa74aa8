#!/usr/bin/env bash
# The quickstart's second command and CI's job: install what is missing, build
# with every backend whose compiler is present, run every test, then run the
# host tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# GPU tests skip cleanly on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash ci/setup.sh

echo "== build (all backends whose compiler is present)"
bash ci/build.sh
echo "== tests (build done at ${SECONDS} s)"
ctest --test-dir build --output-on-failure --parallel "$jobs"

echo "== host tests under ASan + UBSan"
BUILD_DIR=build-asan bash ci/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGDNKIT_SANITIZE=ON \
  -DGDNKIT_ENABLE_CUDA=OFF -DGDNKIT_ENABLE_HIP=OFF -DGDNKIT_BUILD_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --parallel "$jobs" -E consumer

# The package is built here with the host backend only: the library's CUDA
# build was proven above, and the package's CUDA path needs a GPU to test
# (ci/gpu_check.sh python); building the kernels twice would double CI's time.
echo "== Python package: pip install . into a fresh venv with torch and transformers, pytest (CUDA tests skip without a GPU)"
CMAKE_ARGS="-DGDNKIT_ENABLE_CUDA=OFF ${CMAKE_ARGS:-}" bash python/run_tests.sh
echo "== all tests passed in ${SECONDS} s"
