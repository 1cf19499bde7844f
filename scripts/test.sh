#!/usr/bin/env bash
# The README's test command: make a virtual environment, install tensorgate with its test
# extra, and run the whole suite in parallel (CPU only; gpu_tests/ skip without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/python -m pytest -n 2 "$@"
# Again in the other process layout (the run above takes the default: front ends and an
# executor wherever there are 2 or more cores). Only for the whole suite.
if [[ $# -eq 0 ]]; then
    TENSORGATE_TEST_FRONTENDS=0 .venv/bin/python -m pytest -n 2 -q tests
fi
