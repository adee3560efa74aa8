#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the GPU tests, `gdn verify --backend cuda`,
# the A100 path through the driver's PTX JIT, compute-sanitizer, the
# benchmark and `gdn run`. Expects build-gpu/ (ci/build.sh with the default
# sm_80;sm_90 targets) and build-ptx/ (-DGDNKIT_CUDA_ARCHITECTURES=80-virtual)
# built beforehand (for `hip`: build-hip32/ and build-hip64/, configured with
# -DGDNKIT_ENABLE_HIP=ON -DGDNKIT_HIP_ON_NVIDIA=ON -DGDNKIT_HIP_WARP_SIZE=32|64),
# and LIBS pointing at Kokkos / Google Benchmark if the machine lacks them.
# Usage: ci/gpu_check.sh [tests|sanitize|memcheck|racecheck|bench|fused|hip|run]...
# (sanitize = memcheck and racecheck; apart, each fits a 10-minute call
# beside tests or fused on the H200.)
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
sanitize|memcheck|racecheck)
  tools=$w; [ $w = sanitize ] && tools="memcheck racecheck"
  for tool in $tools; do
    step "compute-sanitizer $tool"
    # racecheck's own "failure to track a kernel launch" on the 8-thread
    # concurrency test (which memcheck runs): left out of racecheck only.
    filter='*'
    [ $tool = racecheck ] && filter='-*Concurrency*'
    compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/tests/test_cuda --gtest_brief=1 \
      --gtest_filter="$filter" > "$out/sanitizer_$tool.txt" 2>&1; rc=$?
    tail -4 "$out/sanitizer_$tool.txt"
    compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/tests/test_cuda_specific \
      --gtest_brief=1 --gtest_filter=-*PoolBeyond* >> "$out/sanitizer_$tool.txt" 2>&1; rc2=$?
    summary+=("compute-sanitizer $tool: rc=$rc/$rc2 $(grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_$tool.txt" | sort | uniq -c | tr '\n' ' ')")
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
hip)
  # The HIP backend's sources built for this NVIDIA GPU through the vendor
  # header (build-hip32: 32-lane warps; build-hip64: 64-lane logical warps,
  # the wave64 index arithmetic AMD runs): the shared suites and gdn verify.
  for w in 32 64; do
    [ -x build-hip$w/tests/test_hip ] || { summary+=("HIP source path, $w lanes: build-hip$w missing"); status=1; continue; }
    step "HIP source path on NVIDIA, $w-lane warps"
    build-hip$w/tools/gdn info | grep hip
    build-hip$w/tests/test_hip --gtest_brief=1 > "$out/test_hip$w.txt" 2>&1; rc=$?; tail -3 "$out/test_hip$w.txt"
    build-hip$w/tools/gdn verify --backend hip > "$out/verify_hip$w.txt" 2>&1; rc2=$?; tail -1 "$out/verify_hip$w.txt"
    summary+=("HIP source path, $w-lane warps: test_hip rc=$rc $(grep -E '^\[  PASSED|FAILED TEST' "$out/test_hip$w.txt" | head -1); gdn verify --backend hip rc=$rc2 $(tail -1 "$out/verify_hip$w.txt")")
    [ $rc -eq 0 ] && [ $rc2 -eq 0 ] || status=1
  done
  step "compute-sanitizer racecheck, 64-lane logical warps (shared-memory exchanges)"
  compute-sanitizer --tool racecheck --error-exitcode 99 build-hip64/tests/test_hip --gtest_brief=1 \
    --gtest_filter='*Random*:*Golden*' > "$out/racecheck_hip64.txt" 2>&1; rc=$?
  tail -2 "$out/racecheck_hip64.txt"
  summary+=("racecheck hip64: rc=$rc $(grep -h 'RACECHECK SUMMARY' "$out/racecheck_hip64.txt" | head -1)")
  [ $rc -eq 0 ] || status=1
  ;;
fused)
  step "the fused middle (conv + step + gated RMSNorm) and PDL"
  build-gpu/bench/bench_fused --benchmark_out="$out/bench_fused.json" --benchmark_out_format=json \
    > "$out/bench_fused.txt" 2>&1; rc=$?
  sed -n '/^fused middle/,$p' "$out/bench_fused.txt"
  summary+=("bench_fused: rc=$rc")
  [ $rc -eq 0 ] || status=1
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
