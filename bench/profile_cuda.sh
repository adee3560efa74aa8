#!/usr/bin/env bash
# Nsight Compute on one decode call per configuration (cold caches, clocks
# left alone), for the stall reasons behind bench/RESULTS.md's ratios.
# Usage: bench/profile_cuda.sh [BUILD_DIR]  (prints one block per configuration)
# The full reports go to the folder $OUT names (default /tmp/gdn-prof).
set -u
build=${1:-build-gpu}
out=${OUT:-/tmp/gdn-prof}
mkdir -p "$out"
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section LaunchStats --section MemoryWorkloadAnalysis
          --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
# CONFIGS="kv bf16 512,vk fp32 1" picks configurations (layout, state dtype, B).
if [ -n "${CONFIGS:-}" ]; then IFS=, read -ra cfgs <<< "$CONFIGS"; else
  cfgs=("vk fp32 1" "vk bf16 1" "kv bf16 1" "vk fp32 8" "vk bf16 32" "kv bf16 32" "kv bf16 512" "vk bf16 512"); fi
for cfg in "${cfgs[@]}"; do
  set -- $cfg
  name="$1-$2-B$3"
  ncu --clock-control none -k regex:decode --launch-skip 6 --launch-count 1 "${sections[@]}" \
    "$build/tools/gdn" run --backend cuda --layout "$1" --state-dtype "$2" --batch "$3" --steps 1 --layers 8 \
    --check-every 1000 > "$out/$name.txt" 2>&1
  echo "== $name"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Block Size|Grid Size|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Waves Per SM|Block Limit|Shared Memory Config|Dynamic Shared|stall|Stall|issue_stalled" "$out/$name.txt" \
    | sed -E 's/ +/ /g' | grep -v -E " 0(\.0+)?$" | head -60
done
