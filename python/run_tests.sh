#!/usr/bin/env bash
# The Python package's CI step (ci/test.sh calls it): build and install gdnkit with
# `pip install .` into a fresh virtual environment of Debian's python3 (which sees
# Debian's numpy), then run pytest on python/tests. The build tools come from PyPI
# into that venv; the build itself (--no-build-isolation) downloads nothing.
# torch and transformers come from PyPI too (about 2 minutes, 5.5 GB: PyPI's Linux torch
# carries its CUDA libraries), so that the torch ops, the drop-ins and the transformers
# integration are tested on the CPU; their CUDA tests skip without a GPU. GDNKIT_TEST_TORCH=0
# leaves torch out (the test_torch_*.py and transformers files then skip whole).
#
#   bash python/run_tests.sh [pytest args...]     (PYTHON=/path/to/python3 to pick another)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-/usr/bin/python3}
venv=build-python/venv
start=$(date +%s)

rm -rf "$venv"
"$python" -m venv --system-site-packages "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q "scikit-build-core>=0.10" "nanobind>=2.0" pytest
# numpy arrays of bfloat16 (optional): 0.4 is the last ml_dtypes for Debian 12's numpy 1.24.
"${pip[@]}" install -q "ml_dtypes<0.5" || echo "python/run_tests.sh: no ml_dtypes, its test will skip"
if [ "${GDNKIT_TEST_TORCH:-1}" != 0 ]; then
  # (through pip's cache: the venv is made anew each run, the download only once)
  "${pip[@]}" install -q torch transformers
fi
echo "python/run_tests.sh: venv ready in $(( $(date +%s) - start )) s"

"${pip[@]}" install --no-build-isolation .
echo "python/run_tests.sh: built and installed in $(( $(date +%s) - start )) s"

"$venv/bin/python" -c 'import gdnkit, json; print(json.dumps(gdnkit.info(), indent=1))'
"$venv/bin/python" -m pytest -q -rs python/tests "$@"
echo "python/run_tests.sh: done in $(( $(date +%s) - start )) s"
