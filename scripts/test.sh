#!/usr/bin/env bash
# The README's test command: make a virtual environment, install tensorgate with its test
# extra, and run the whole suite in parallel (CPU only; gpu_tests/ skip without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
# Bytecode for the sources, once: every server a test starts is 1-4 fresh interpreters, and
# where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) each compiled every module of
# the project again (0.3-0.4 s of CPU per process). pip does this for installed packages.
.venv/bin/python -m compileall -q -j 0 server backends scripts tests triton_python_backend_utils.py
# The test modules whose servers take the process layout from TENSORGATE_TEST_FRONTENDS are
# noted as they run (tests/server_process.py).
layouts=$(mktemp)
trap 'rm -f "$layouts"' EXIT
TENSORGATE_TEST_LAYOUT_LOG=$layouts .venv/bin/python -m pytest -n 2 "$@"
# Those modules again in the other process layout (the run above takes the default: front
# ends and an executor wherever there are 2 or more cores). Only after the whole suite.
if [[ $# -eq 0 ]]; then
    mapfile -t modules < <(sort -u "$layouts")
    TENSORGATE_TEST_FRONTENDS=0 .venv/bin/python -m pytest -n 2 -q "${modules[@]:-tests}"
fi
