#!/usr/bin/env bash
# Every GPU check in one command (under 5 minutes on one GPU): the gpu_tests/ suite, then the
# GPU benchmark. Meant for the device machine, whose Python has CuPy, onnxruntime, grpcio,
# protobuf and pytest but not this project's other dependencies, and no registry: carry them
# as wheels in .whl/ (`bash scripts/gpu_wheels.sh` downloads them where PyPI is reachable) and
# they are installed into a private folder first. On any machine with the project installed (`pip install -e '.[test,gpu]'`) it runs
# as it is. Prints what it finds; exits non-zero when a test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/tensorgate-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/tensorgate-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
export TENSORGATE_REQUIRE_GPU=1  # gpu_tests/ fail instead of skipping when no device is seen
out=${OUT:-/tmp}

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PYTHON" - <<'PY'
import importlib
for name in ("cupy", "onnxruntime", "tornado", "grpc", "google.protobuf", "pynvml"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as exc:  # report, don't stop: the checks skip what they cannot run
        print(f"{name} missing ({type(exc).__name__}: {exc})")
try:
    import onnxruntime
    print("onnxruntime providers:", onnxruntime.get_available_providers())
except Exception:
    pass
PY

echo "== gpu_tests"
"$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="" gpu_tests 2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}

echo "== arena hostRegister (scale-out: the executor pins each front end's arena)"
"$PYTHON" -m pytest -q -s -p no:cacheprovider -o addopts="" gpu_tests/test_arena_host_register.py 2>&1 \
    | tee "$out/arena_host_register.log"

echo "== bench_gpu"
timeout 240 "$PYTHON" scripts/bench_gpu.py --json "$out/bench_gpu.json" 2>&1 | tee "$out/bench_gpu.log"
exit "$status"
