#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the GPU tests, `gdn verify --backend cuda`,
# the A100 path through the driver's PTX JIT, compute-sanitizer, the
# benchmark and `gdn run`. Expects build-gpu/ (ci/build.sh with the default
# sm_80;sm_90 targets) and build-ptx/ (-DGDNKIT_CUDA_ARCHITECTURES=80-virtual)
# built beforehand, and LIBS pointing at Kokkos / Google Benchmark if the
# machine lacks them. Usage: ci/gpu_check.sh [tests|sanitize|bench|run]...
set -u
cd "$(dirname "$0")/.."
root=$PWD
export LD_LIBRARY_PATH="${LIBS:-$root/.carry/lib}:${LD_LIBRARY_PATH:-}"
out=${OUT:-/tmp/gdn-gpu}
mkdir -p "$out"
# The tests find the golden set at the path compiled in: make it resolve here.
golden_dir=$(strings build-gpu/tests/test_cuda | grep -m1 '/tests/golden$' || true)
if [ -n "$golden_dir" ] && [ ! -e "$golden_dir" ]; then
  src_root=$(dirname "$(dirname "$golden_dir")")
  mkdir -p "$(dirname "$src_root")" && ln -sfn "$root" "$src_root"
fi
status=0
step() { echo; echo "== $*"; }
summary=()

for what in "${@:-tests sanitize bench run}"; do
for w in $what; do
case $w in
tests)
  step "device"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  build-gpu/tools/gdn info
  step "shared suites on cuda"
  build-gpu/tests/test_cuda --gtest_brief=1 > "$out/test_cuda.txt" 2>&1; rc=$?; tail -3 "$out/test_cuda.txt"
  summary+=("test_cuda (sm_90 code): rc=$rc $(grep -E '^\[  PASSED|FAILED TEST' "$out/test_cuda.txt" | head -1)")
  [ $rc -eq 0 ] || status=1
  step "cuda-only tests"
  build-gpu/tests/test_cuda_specific --gtest_brief=1 > "$out/test_cuda_specific.txt" 2>&1; rc=$?; tail -3 "$out/test_cuda_specific.txt"
  summary+=("test_cuda_specific: rc=$rc $(grep -E '^\[  PASSED|FAILED TEST' "$out/test_cuda_specific.txt" | head -1)")
  [ $rc -eq 0 ] || status=1
  step "gdn verify --backend cuda"
  build-gpu/tools/gdn verify --backend cuda > "$out/verify.txt" 2>&1; rc=$?; tail -1 "$out/verify.txt"
  summary+=("gdn verify --backend cuda: rc=$rc $(tail -1 "$out/verify.txt")")
  [ $rc -eq 0 ] || status=1
  step "A100 path: compute_80 PTX only, CUDA_FORCE_PTX_JIT=1"
  CUDA_FORCE_PTX_JIT=1 build-ptx/tests/test_cuda --gtest_brief=1 > "$out/test_cuda_ptx80.txt" 2>&1; rc=$?
  tail -3 "$out/test_cuda_ptx80.txt"
  CUDA_FORCE_PTX_JIT=1 build-ptx/tests/test_cuda_specific --gtest_brief=1 >> "$out/test_cuda_ptx80.txt" 2>&1; rc2=$?
  summary+=("PTX-JIT compute_80 suites: rc=$rc/$rc2")
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ] || status=1
  ;;
sanitize)
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool"
    compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/tests/test_cuda --gtest_brief=1 \
      > "$out/sanitizer_$tool.txt" 2>&1; rc=$?
    tail -4 "$out/sanitizer_$tool.txt"
    compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/tests/test_cuda_specific \
      --gtest_brief=1 --gtest_filter=-*PoolBeyond* >> "$out/sanitizer_$tool.txt" 2>&1; rc2=$?
    summary+=("compute-sanitizer $tool: rc=$rc/$rc2 $(grep -h 'ERROR SUMMARY' "$out/sanitizer_$tool.txt" | sort | uniq -c | tr '\n' ' ')")
    [ $rc -eq 0 ] && [ $rc2 -eq 0 ] || status=1
  done
  ;;
bench)
  step "benchmark (graph replay, cold L2, copy floor in the same run)"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv,noheader -lms 500 > "$out/clocks.txt" 2>&1 &
  smi=$!
  build-gpu/bench/bench_cuda --benchmark_out="$out/bench.json" --benchmark_out_format=json \
    > "$out/bench.txt" 2>&1; rc=$?
  kill $smi 2>/dev/null
  summary+=("bench_cuda: rc=$rc; SM clock seen (MHz, min/max): $(cut -d, -f1 "$out/clocks.txt" | grep -o '[0-9]*' | sort -n | sed -n '1p;$p' | tr '\n' ' ')")
  ;;
run)
  for b in 1 64; do
    step "gdn run --backend cuda --batch $b"
    build-gpu/tools/gdn run --backend cuda --batch $b --steps 40 > "$out/gdn_run_b$b.txt" 2>&1; rc=$?
    tail -6 "$out/gdn_run_b$b.txt"
    summary+=("gdn run B=$b: rc=$rc $(grep 'per-token' "$out/gdn_run_b$b.txt")")
  done
  ;;
esac
done
done

echo
echo "== summary"
for s in "${summary[@]}"; do echo "  $s"; done
[ -f "$out/bench.txt" ] && sed -n '/^case /,$p' "$out/bench.txt"
exit $status
