#!/usr/bin/env bash
# The GPU checks, on any machine with an NVIDIA GPU (ci/test.sh covers the
# rest; without a GPU its GPU tests skip).
#
#   bash ci/gpu_check.sh [STEP]...      no STEP: every step below, in this order
#
# Steps:
#   tests      the shared suites and the CUDA-only tests on the GPU (build-gpu),
#              `gdn verify --backend cuda`, and the A100 path: the suites from
#              compute_80 PTX only, run through the driver's JIT (build-ptx,
#              CUDA_FORCE_PTX_JIT=1)
#   plan       this GPU's occupancy table (`tune_cuda table`), the planner's only
#              device-dependent input; on an H200 compared with the one
#              tests/test_plan.cpp assumes (tests/plan_h200_device.inc)
#   sanitize   memcheck, then racecheck (each a step of its own too)
#   memcheck   compute-sanitizer memcheck of both suites
#   racecheck  compute-sanitizer racecheck of both suites
#   bench      bench_cuda: the step against the copy floor (graph replay, cold
#              L2), with the SM clock sampled alongside
#   fused      bench_fused: the fused middle (conv1d + step + gated RMSNorm) and PDL
#   hip        the HIP backend's sources built for this GPU (build-hip32: 32-lane
#              warps; build-hip64: 64-lane logical warps, the index arithmetic
#              AMD runs): test_hip, `gdn verify --backend hip`, racecheck of hip64
#   python     the Python package built with CUDA for this GPU into
#              build-gpu/python (wheel and an unpacked site dir; the system
#              Python is left alone), pytest python/tests (the torch tests on
#              CUDA tensors: ops, drop-in wrappers, CUDA graphs, torch.compile,
#              torch.export, AOTInductor) and python/bench_overhead.py
#   run        `gdn run --backend cuda` at B = 1 and 64
#   tokens     bench_tokens: multi-token decode against T chained one-token
#              calls and its state-traffic floor
#   peers      bench/peers.py: gdnkit (in place, double-buffered) against FLA's
#              fused_recurrent kernel and a vLLM-style Triton kernel, both floors,
#              in one process (FLA from the environment, or from the wheels in
#              $FLA_WHEELS); the Python package of the `python` step, built if missing
#   e2e        bench/e2e_transformers.py: a transformers model's decode, its own
#              path against patch_transformers (needs transformers; FLA as above)
# A summary of every step is printed last.
#
# Needs: an NVIDIA GPU with its driver (nvidia-smi); the CUDA toolkit (nvcc,
# compute-sanitizer) at $CUDA_HOME, by default /usr/local/cuda; the Debian 12
# packages of ci/setup.sh, or equivalents (cmake, ninja, g++, Kokkos,
# GoogleTest, Google Benchmark, nlohmann-json; for `python` also python3-dev
# and, in the Python that $PYTHON names (default python3), numpy, pytest,
# scikit-build-core, nanobind and a CUDA build of torch). ROCm is not needed.
#
# Build folders: each step builds the folders it uses with ci/build.sh when
# they are missing (no CMakeCache.txt), and brings existing ones up to date
# with `cmake --build`:
#   build-gpu     the default CUDA architectures (sm_80, sm_90, compute_90)
#   build-ptx     -DGDNKIT_CUDA_ARCHITECTURES=80-virtual
#   build-hip32   -DGDNKIT_ENABLE_HIP=ON -DGDNKIT_HIP_ON_NVIDIA=ON -DGDNKIT_HIP_WARP_SIZE=32
#   build-hip64   the same with -DGDNKIT_HIP_WARP_SIZE=64
#   (the two HIP folders without the CUDA backend, for this GPU's architecture only)
#
# Environment:
#   GDN_GPU_LOG_DIR       where every step's full log goes (default build-gpu/logs)
#   GDNKIT_EXTRA_LIB_DIR  put in front of LD_LIBRARY_PATH: for machines where
#                         Kokkos or Google Benchmark live outside the default
#                         library path (for cmake to find them, set
#                         CMAKE_PREFIX_PATH as well)
#   PYTHON                the interpreter of the `python` step (default python3)
#   CMAKE_ARGS            extra -D settings for the `python` step's build
#   FLA_WHEELS            a folder of flash-linear-attention, fla-core and einops
#                         wheels for `peers` and `e2e` when FLA does not import
#
# Exit status: 0 when every step passed; 1 when a check or a build failed;
# 2 on an unknown step or when no NVIDIA GPU or CUDA toolkit is found
# (nothing run).
set -u
cd "$(dirname "$0")/.."
root=$PWD

all_steps="tests plan sanitize bench fused hip python run tokens"
steps=()
for arg in "${@:-$all_steps}"; do
  for w in $arg; do
    case $w in
      tests|plan|sanitize|memcheck|racecheck|bench|fused|hip|python|run|tokens|peers|e2e) steps+=("$w") ;;
      -h|--help) sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) echo "ci/gpu_check.sh: unknown step '$w' (steps: $all_steps memcheck racecheck peers e2e)" >&2; exit 2 ;;
    esac
  done
done

cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -d "$cuda_home/bin" ] && export PATH="$cuda_home/bin:$PATH"
if [ -n "${GDNKIT_EXTRA_LIB_DIR:-}" ]; then
  export LD_LIBRARY_PATH="$GDNKIT_EXTRA_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "ci/gpu_check.sh: no NVIDIA GPU found (nvidia-smi -L failed)" >&2
  exit 2
fi
if ! command -v nvcc > /dev/null; then
  echo "ci/gpu_check.sh: no CUDA toolkit (nvcc) in $cuda_home/bin or on PATH" >&2
  exit 2
fi
# This GPU's architecture (9.0 -> 90), for the builds that only need to run here.
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
case $arch in ''|*[!0-9]*) arch=90 ;; esac

log=${GDN_GPU_LOG_DIR:-build-gpu/logs}
mkdir -p "$log"
log=$(cd "$log" && pwd)
status=0
summary=()
step() { echo; echo "== $*"; }
fail() { summary+=("$*"); status=1; }
# The first PASSED or FAILED line of a GoogleTest log.
gtest_line() { grep -E '^\[  PASSED|FAILED TEST' "$1" | head -1; }

# ensure DIR [CMAKE ARGS...]: configure and build DIR with ci/build.sh when it
# has never been configured, else bring it up to date. Once per folder a run.
declare -A built=()
ensure() {
  local dir=$1; shift
  [ -n "${built[$dir]:-}" ] && { [ "${built[$dir]}" = ok ]; return; }
  local rc
  if [ -f "$dir/CMakeCache.txt" ]; then
    step "build $dir (up to date with the sources)"
    cmake --build "$dir" --parallel "$(nproc)" > "$log/build_$dir.txt" 2>&1; rc=$?
  else
    step "build $dir: ci/build.sh $*"
    BUILD_DIR=$dir bash ci/build.sh "$@" > "$log/build_$dir.txt" 2>&1; rc=$?
  fi
  tail -2 "$log/build_$dir.txt"
  if [ $rc -ne 0 ]; then
    built[$dir]=failed
    fail "build $dir: FAILED rc=$rc (log: $log/build_$dir.txt); the steps that need it did not run"
    return 1
  fi
  built[$dir]=ok
}
ensure_gpu() { ensure build-gpu; }

# The tests read the golden set from the source path compiled into them; when
# a build folder was made in another checkout, point that path at this one.
link_golden() {
  local golden_dir src_root
  golden_dir=$(strings "$1" 2>/dev/null | grep -m1 '/tests/golden$' || true)
  if [ -n "$golden_dir" ] && [ ! -e "$golden_dir" ]; then
    src_root=$(dirname "$(dirname "$golden_dir")")
    mkdir -p "$(dirname "$src_root")" && ln -sfn "$root" "$src_root"
  fi
}

run_tests() {
  ensure_gpu || return
  link_golden build-gpu/tests/test_cuda
  step "device"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  build-gpu/tools/gdn info
  step "shared suites on cuda"
  build-gpu/tests/test_cuda --gtest_brief=1 > "$log/test_cuda.txt" 2>&1; rc=$?
  tail -3 "$log/test_cuda.txt"
  summary+=("test_cuda: rc=$rc $(gtest_line "$log/test_cuda.txt")")
  [ $rc -eq 0 ] || status=1
  step "cuda-only tests"
  build-gpu/tests/test_cuda_specific --gtest_brief=1 > "$log/test_cuda_specific.txt" 2>&1; rc=$?
  tail -3 "$log/test_cuda_specific.txt"
  summary+=("test_cuda_specific: rc=$rc $(gtest_line "$log/test_cuda_specific.txt")")
  [ $rc -eq 0 ] || status=1
  step "gdn verify --backend cuda"
  build-gpu/tools/gdn verify --backend cuda > "$log/verify.txt" 2>&1; rc=$?
  tail -1 "$log/verify.txt"
  summary+=("gdn verify --backend cuda: rc=$rc $(tail -1 "$log/verify.txt")")
  [ $rc -eq 0 ] || status=1

  ensure build-ptx -DGDNKIT_CUDA_ARCHITECTURES=80-virtual || return
  link_golden build-ptx/tests/test_cuda
  step "A100 path: compute_80 PTX only, CUDA_FORCE_PTX_JIT=1"
  CUDA_FORCE_PTX_JIT=1 build-ptx/tests/test_cuda --gtest_brief=1 > "$log/test_cuda_ptx80.txt" 2>&1; rc=$?
  CUDA_FORCE_PTX_JIT=1 build-ptx/tests/test_cuda_specific --gtest_brief=1 \
    >> "$log/test_cuda_ptx80.txt" 2>&1; rc2=$?
  tail -3 "$log/test_cuda_ptx80.txt"
  summary+=("PTX-JIT compute_80 suites: rc=$rc/$rc2")
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ] || status=1
}

run_sanitizer() {  # memcheck | racecheck
  local tool=$1 filter='*'
  ensure_gpu || return
  link_golden build-gpu/tests/test_cuda
  step "compute-sanitizer $tool"
  # racecheck loses track of kernel launches in the 8-thread concurrency test
  # (a tool limitation; memcheck runs it): left out of racecheck only.
  [ "$tool" = racecheck ] && filter='-*Concurrency*'
  compute-sanitizer --tool "$tool" --error-exitcode 99 build-gpu/tests/test_cuda --gtest_brief=1 \
    --gtest_filter="$filter" > "$log/sanitizer_$tool.txt" 2>&1; rc=$?
  tail -4 "$log/sanitizer_$tool.txt"
  # PoolBeyond* (a 16 GiB pool, 64-bit offsets) is left out under the sanitizer.
  compute-sanitizer --tool "$tool" --error-exitcode 99 build-gpu/tests/test_cuda_specific \
    --gtest_brief=1 --gtest_filter=-*PoolBeyond* >> "$log/sanitizer_$tool.txt" 2>&1; rc2=$?
  summary+=("compute-sanitizer $tool: rc=$rc/$rc2 $(grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log/sanitizer_$tool.txt" | sort | uniq -c | tr '\n' ' ')")
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ] || status=1
}

run_bench() {
  ensure_gpu || return
  step "benchmark (graph replay, cold L2, copy floor in the same run)"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv,noheader -lms 500 > "$log/clocks.txt" 2>&1 &
  local smi=$!
  build-gpu/bench/bench_cuda --benchmark_out="$log/bench.json" --benchmark_out_format=json \
    > "$log/bench.txt" 2>&1; rc=$?
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  sed -n '/^case /,$p' "$log/bench.txt"
  summary+=("bench_cuda: rc=$rc; SM clock seen (MHz, min/max): $(cut -d, -f1 "$log/clocks.txt" | grep -o '[0-9]*' | sort -n | sed -n '1p;$p' | tr '\n' ' ')")
  [ $rc -eq 0 ] || status=1
}

run_fused() {
  ensure_gpu || return
  step "the fused middle (conv + step + gated RMSNorm) and PDL"
  build-gpu/bench/bench_fused --benchmark_out="$log/bench_fused.json" --benchmark_out_format=json \
    > "$log/bench_fused.txt" 2>&1; rc=$?
  sed -n '/^fused middle/,$p' "$log/bench_fused.txt"
  summary+=("bench_fused: rc=$rc")
  [ $rc -eq 0 ] || status=1
}

run_hip() {
  local w
  for w in 32 64; do
    # (line information, so racecheck names the source lines of what it reports)
    ensure build-hip$w -DGDNKIT_ENABLE_CUDA=OFF -DGDNKIT_ENABLE_HIP=ON -DGDNKIT_HIP_ON_NVIDIA=ON \
      -DGDNKIT_HIP_WARP_SIZE=$w -DGDNKIT_CUDA_ARCHITECTURES=$arch-real -DCMAKE_CUDA_FLAGS=-lineinfo || continue
    link_golden build-hip$w/tests/test_hip
    step "HIP source path on NVIDIA, $w-lane warps"
    build-hip$w/tools/gdn info | grep hip
    build-hip$w/tests/test_hip --gtest_brief=1 > "$log/test_hip$w.txt" 2>&1; rc=$?
    tail -3 "$log/test_hip$w.txt"
    build-hip$w/tools/gdn verify --backend hip > "$log/verify_hip$w.txt" 2>&1; rc2=$?
    tail -1 "$log/verify_hip$w.txt"
    summary+=("HIP source path, $w-lane warps: test_hip rc=$rc $(gtest_line "$log/test_hip$w.txt"); gdn verify --backend hip rc=$rc2 $(tail -1 "$log/verify_hip$w.txt")")
    [ $rc -eq 0 ] && [ $rc2 -eq 0 ] || status=1
  done
  [ "${built[build-hip64]:-}" = ok ] || return
  step "compute-sanitizer racecheck, 64-lane logical warps (shared-memory exchanges)"
  compute-sanitizer --tool racecheck --error-exitcode 99 build-hip64/tests/test_hip --gtest_brief=1 \
    --gtest_filter='*Random*:*Golden*:*MultiToken*' > "$log/racecheck_hip64.txt" 2>&1; rc=$?
  tail -2 "$log/racecheck_hip64.txt"
  # the source lines of the hazards' accesses, most reported first
  grep -o ' in [a-z_]*\.cuh\?:[0-9]*' "$log/racecheck_hip64.txt" | sort | uniq -c | sort -rn | head -12
  summary+=("racecheck hip64: rc=$rc $(grep -h 'RACECHECK SUMMARY' "$log/racecheck_hip64.txt" | head -1)")
  [ $rc -eq 0 ] || status=1
}

# The Python package with CUDA for this GPU, unpacked into build-gpu/python/site.
python_built=""
build_python() {
  [ -n "$python_built" ] && { [ "$python_built" = ok ]; return; }
  python_built=failed
  local py=${PYTHON:-python3} dir=$root/build-gpu/python start wheel args
  step "Python package with CUDA (sm_$arch): build"
  "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' \
    || echo "(torch does not import: its tests will skip)"
  # scikit-build-core's PEP 517 hook directly (what `pip wheel --no-build-isolation`
  # calls): no pip needed, nothing downloaded. Its own CMake build folder, so
  # these -D settings stay out of `pip install .`'s.
  args="-DGDNKIT_ENABLE_CUDA=ON -DGDNKIT_ENABLE_HIP=OFF -DGDNKIT_CUDA_ARCHITECTURES=$arch-real"
  rm -rf "$dir/wheel" "$dir/site"
  mkdir -p "$dir/wheel"
  start=$(date +%s)
  CMAKE_ARGS="$args ${CMAKE_ARGS:-}" "$py" -c 'import sys; from scikit_build_core.build import build_wheel
print(build_wheel(sys.argv[1], {"build-dir": sys.argv[2]}))' "$dir/wheel" "$dir/build" \
    > "$log/python_build.txt" 2>&1; rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s"
  tail -3 "$log/python_build.txt"
  wheel=$(ls "$dir"/wheel/gdnkit-*.whl 2>/dev/null | head -1)
  if [ $rc -ne 0 ] || [ -z "$wheel" ]; then
    fail "python: build FAILED rc=$rc (log: $log/python_build.txt)"
    return 1
  fi
  # Unpacked into a folder on PYTHONPATH: nothing is installed into the Python itself.
  "$py" -m zipfile -e "$wheel" "$dir/site"
  python_built=ok
}

run_python() {
  local py=${PYTHON:-python3} dir=$root/build-gpu/python
  build_python || return
  step "Python package: pytest python/tests"
  PYTHONPATH=$dir/site "$py" -c 'import gdnkit, pprint; pprint.pprint(gdnkit.info())'
  PYTHONPATH=$dir/site "$py" -m pytest -v -rs python/tests > "$log/pytest.txt" 2>&1; rc=$?
  grep -E "FAILED|ERROR|SKIPPED" "$log/pytest.txt" | tail -40
  tail -1 "$log/pytest.txt"
  summary+=("python pytest: rc=$rc $(tail -1 "$log/pytest.txt")")
  [ $rc -eq 0 ] || status=1
  step "Python package: per-call overhead (B = 1)"
  PYTHONPATH=$dir/site "$py" python/bench_overhead.py --json "$log/bench_overhead.json" \
    > "$log/bench_overhead.txt" 2>&1; rc=$?
  cat "$log/bench_overhead.txt"
  summary+=("python bench_overhead: rc=$rc")
  [ $rc -eq 0 ] || status=1
}

run_gdn() {
  local b
  ensure_gpu || return
  for b in 1 64; do
    step "gdn run --backend cuda --batch $b"
    build-gpu/tools/gdn run --backend cuda --batch $b --steps 40 > "$log/gdn_run_b$b.txt" 2>&1; rc=$?
    tail -6 "$log/gdn_run_b$b.txt"
    summary+=("gdn run B=$b: rc=$rc $(grep 'per-token' "$log/gdn_run_b$b.txt")")
    [ $rc -eq 0 ] || status=1
  done
}

run_tokens() {
  ensure_gpu || return
  step "multi-token decode (bench_tokens)"
  build-gpu/bench/bench_tokens --benchmark_out="$log/bench_tokens.json" --benchmark_out_format=json \
    > "$log/bench_tokens.txt" 2>&1; rc=$?
  grep -v -E '^tokens/|^-{10}|^Benchmark' "$log/bench_tokens.txt" | tail -120
  summary+=("bench_tokens: rc=$rc")
  [ $rc -eq 0 ] || status=1
}

# FLA for peers and e2e: importable already, or unpacked from $FLA_WHEELS.
fla_path() {
  local py=${PYTHON:-python3} dir=$root/build-gpu/python/fla
  if [ -n "${FLA_WHEELS:-}" ] && ! "$py" -c 'import fla' > /dev/null 2>&1; then
    rm -rf "$dir" && mkdir -p "$dir"
    for w in "$FLA_WHEELS"/*.whl; do "$py" -m zipfile -e "$w" "$dir"; done
    echo "$dir"
  fi
}

run_peers() {
  local py=${PYTHON:-python3} site=$root/build-gpu/python/site fla
  build_python || return
  fla=$(fla_path)
  step "peers in one run (bench/peers.py)"
  PYTHONPATH=$site${fla:+:$fla} "$py" bench/peers.py --out "$log/peers.md" --csv "$log/peers.csv" \
    > "$log/peers.txt" 2> "$log/peers_err.txt"; rc=$?
  cat "$log/peers.txt"
  tail -5 "$log/peers_err.txt"
  summary+=("peers: rc=$rc (table: $log/peers.md)")
  [ $rc -eq 0 ] || status=1
}

run_e2e() {
  local py=${PYTHON:-python3} site=$root/build-gpu/python/site fla
  build_python || return
  fla=$(fla_path)
  step "end to end: transformers decode, patched and not (bench/e2e_transformers.py)"
  PYTHONPATH=$site${fla:+:$fla} "$py" bench/e2e_transformers.py --json "$log/e2e.json" \
    > "$log/e2e.txt" 2>&1; rc=$?
  tail -40 "$log/e2e.txt"
  summary+=("e2e_transformers: rc=$rc (json: $log/e2e.json)")
  [ $rc -eq 0 ] || status=1
}

# The occupancy table against the one the planner's CPU test assumes (an H200's).
run_plan() {
  ensure_gpu || return
  step "the planner's device table (tune_cuda table)"
  build-gpu/bench/tune_cuda table > "$log/plan_table.txt" 2>&1; local rc=$?
  if [ $rc -ne 0 ]; then fail "plan table: tune_cuda table rc=$rc"; return; fi
  if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q 'H200'; then
    summary+=("plan table: $(wc -l < "$log/plan_table.txt") entries (not an H200: not compared)")
    return
  fi
  if diff <(sed 's| *//.*||' tests/plan_h200_device.inc) "$log/plan_table.txt" > "$log/plan_table_diff.txt"; then
    summary+=("plan table: the H200's equals tests/plan_h200_device.inc ($(wc -l < "$log/plan_table.txt") entries)")
  else
    fail "plan table: the H200's differs from tests/plan_h200_device.inc (diff: $log/plan_table_diff.txt)"
  fi
}

for w in "${steps[@]}"; do
  case $w in
    tests) run_tests ;;
    plan) run_plan ;;
    sanitize) run_sanitizer memcheck; run_sanitizer racecheck ;;
    memcheck|racecheck) run_sanitizer "$w" ;;
    bench) run_bench ;;
    fused) run_fused ;;
    hip) run_hip ;;
    python) run_python ;;
    run) run_gdn ;;
    tokens) run_tokens ;;
    peers) run_peers ;;
    e2e) run_e2e ;;
  esac
done

echo
echo "== summary (logs: $log)"
for s in "${summary[@]}"; do echo "  $s"; done
exit $status
