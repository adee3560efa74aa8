#!/usr/bin/env bash
# Run on the GPU machine (device tool, carry [".carry/py-sdk"]): build the Python package
# with CUDA for sm_90, run the whole pytest suite (torch tests on CUDA tensors: ops,
# drop-in wrappers, CUDA graphs, torch.compile, torch.export, AOTInductor) and the
# per-call overhead benchmark. Results land in $OUT.
#
#   bash python/gpu/build_and_test.sh [build|wheel] [pytest args...]
#     build (default): build here with the carried Kokkos/nlohmann (prepare_carry.sh)
#     wheel: use the cp312 wheel prebuilt by `prepare_carry.sh --wheel` instead
set -u
cd "$(dirname "$0")/../.."
root=$PWD
sdk=$root/.carry/py-sdk
out=${OUT:-/tmp/gdnkit-gpu}
site=/tmp/gdnkit-site
mode=${1:-build}
shift || true
mkdir -p "$out"
rm -rf "$site"
py=${PYTHON:-python3}
status=0

echo "== machine"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$py -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
$py -c 'import nanobind, scikit_build_core; print("nanobind", nanobind.__version__, "scikit-build-core", scikit_build_core.__version__)' || true

if [ "$mode" = "build" ]; then
  echo "== build (scikit-build-core, CUDA sm_90)"
  args="-DGDNKIT_ENABLE_CUDA=ON -DGDNKIT_ENABLE_HIP=OFF -DGDNKIT_CUDA_ARCHITECTURES=90-real"
  args="$args -DKokkos_DIR=$sdk/lib/cmake/Kokkos -Dnlohmann_json_DIR=$sdk/share/cmake/nlohmann_json"
  args="$args -DGDNKIT_PYTHON_BUNDLE=$sdk/lib/libtrilinos_kokkoscore.so.13.2"
  inc=$($py -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if [ ! -f "$inc/Python.h" ] && [ -f "$sdk/python3.12/include/Python.h" ]; then
    echo "(no Python.h at $inc: using the carried 3.12 headers)"
    args="$args -DPython_INCLUDE_DIR=$sdk/python3.12/include"
  fi
  start=$(date +%s)
  # scikit-build-core's PEP 517 hook directly (what `pip wheel --no-build-isolation` calls):
  # works without pip, downloads nothing.
  mkdir -p "$out/wheel"
  # Its own build folder: the -D settings above stay out of the default one's cache.
  CMAKE_ARGS="$args" $py -c 'import sys; from scikit_build_core.build import build_wheel
print(build_wheel(sys.argv[1], {"build-dir": "build-python/gpu-{wheel_tag}"}))' \
    "$out/wheel" > "$out/build.txt" 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s (log: build.txt)"
  tail -5 "$out/build.txt"
  [ $rc -eq 0 ] || exit 1
  wheel=$(ls "$out"/wheel/gdnkit-*.whl | head -1)
else
  wheel=$(ls "$sdk"/wheels/gdnkit-*.whl | head -1)
fi
echo "== install $wheel into $site (PYTHONPATH; nothing touches the system Python)"
$py -m zipfile -e "$wheel" "$site"
export PYTHONPATH=$site
$py -c 'import gdnkit, pprint; pprint.pprint(gdnkit.info())'

echo "== pytest"
$py -m pytest -v -rs python/tests "$@" > "$out/pytest.txt" 2>&1 || status=1
grep -E "PASSED|FAILED|ERROR|SKIPPED" "$out/pytest.txt" | sed 's/^/  /' | tail -80
tail -3 "$out/pytest.txt"

echo "== per-call overhead (B = 1)"
$py python/bench_overhead.py --json "$out/bench_overhead.json" > "$out/bench_overhead.txt" 2>&1 || status=1
cat "$out/bench_overhead.txt"
exit $status
