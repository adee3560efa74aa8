#!/usr/bin/env bash
# The quickstart's first command: install what is missing, build, and run the
# main job, `gdn run` (the GDN part of decoding Qwen3.5-35B-A3B on the best
# backend present). Extra arguments go to `gdn run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
build/tools/gdn info
build/tools/gdn run "$@"
