"""GPU data path benchmark: copies from the pinned pool vs pageable memory, and 16 MB requests
through the server on the GPU path against the copies they cannot avoid.

1. H2D and D2H GB/s of a 16 MiB FP32 tensor: from a pinned buffer of the server's host pool
   and from pageable numpy memory, timed with CUDA events on one stream (median of 50).
2. End to end: ``python -m server`` on 127.0.0.1 serving ``identity_gpu``, a Python-backend
   identity on a KIND_GPU instance (socket → pinned body buffer → device → host → socket; the
   ONNX Runtime CUDA provider is not needed, so this runs where onnxruntime is the CPU build),
   sent 16 MiB FP32 binary HTTP requests one at a time for a few seconds. Reported as MB/s of
   payload beside the pinned H2D + D2H time of the same bytes: the floor the GPU path adds.

    python scripts/bench_gpu.py [--seconds 5] [--json PATH]

Needs CuPy and a CUDA device (exits with a message otherwise); part 2 also needs the server's
dependencies (tornado, orjson, grpcio-health-checking) and is skipped with a message without
them. Figures are for people, never a CI gate.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the project importable
    sys.path.insert(0, str(ROOT))

from server.memory.host_pool import HostBufferPool

NBYTES = 16 << 20
COPIES = 50

MODEL_PY = '''"""Identity on the GPU: the input arrives as a CuPy array on the instance's device."""

import cupy


class TensorgateModel:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        assert isinstance(x, cupy.ndarray), type(x)
        return {"OUTPUT0": x.copy()}
'''
CONFIG = """name: "identity_gpu"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
"""


def copy_rates(cupy: Any) -> dict[str, float]:
    """GB/s (median of ``COPIES``) of H2D and D2H from pinned and pageable memory."""
    pool = HostBufferPool(pinned_limit=64 << 20)
    pinned_buffer = pool.acquire(NBYTES)
    if not pinned_buffer.pinned:
        raise RuntimeError("the host pool did not hand out pinned memory")
    pinned = np.frombuffer(pinned_buffer.view, dtype=np.uint8)
    pageable = np.empty(NBYTES, dtype=np.uint8)
    pinned[:] = 1
    pageable[:] = 1
    device = cupy.empty(NBYTES, dtype=cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    rates: dict[str, float] = {}
    for label, host in (("pinned", pinned), ("pageable", pageable)):
        for direction in ("H2D", "D2H"):
            times = []
            for _ in range(COPIES + 3):
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                if direction == "H2D":
                    device.set(host, stream=stream)
                else:
                    device.get(stream=stream, out=host, blocking=False)
                end.record(stream)
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
            rates[f"{direction} {label}"] = NBYTES / statistics.median(times[3:]) / 1e9
    pinned_buffer.release()
    return rates


def _request(payload: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [payload.size],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": payload.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return header + payload.tobytes(), headers


def end_to_end(seconds: float) -> dict[str, float] | str:
    """MB/s of 16 MiB identity requests through the server's GPU path; a reason if skipped."""
    try:
        import orjson  # noqa: F401
        import tornado  # noqa: F401
    except ImportError as exc:
        return f"skipped: the server's dependencies are missing here ({exc})"
    from scripts.bench_http import ServerUnderTest  # after the check: it needs them too

    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as base:
        model = Path(base) / "identity_gpu"
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").write_text(MODEL_PY)
        (model / "config.pbtxt").write_text(CONFIG)
        try:
            server = ServerUnderTest(
                repositories=[Path(base)], extra_args=("--allow-grpc=false", "--allow-metrics=false")
            )
        except RuntimeError as exc:
            return f"skipped: {exc}"
        try:
            return _drive(server.address, seconds)
        finally:
            server.stop()


def _drive(address: tuple[str, int], seconds: float) -> dict[str, float] | str:
    connection = http.client.HTTPConnection(*address, timeout=60)
    connection.request("GET", "/v2/models/identity_gpu/ready")
    ready = connection.getresponse()
    if ready.status != 200:
        return f"skipped: the model is not ready ({ready.status} {ready.read()[:300]!r})"
    ready.read()
    payload = np.random.default_rng(0).standard_normal(NBYTES // 4).astype(np.float32)
    body, headers = _request(payload)
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end or not latencies:
        began = time.perf_counter()
        connection.request("POST", "/v2/models/identity_gpu/infer", body, headers)
        response = connection.getresponse()
        answer = response.read()
        latencies.append(time.perf_counter() - began)
        if response.status != 200:
            return f"failed: {response.status} {answer[:300]!r}"
        if answer[-payload.nbytes :] != body[-payload.nbytes :]:
            return "failed: the answer's bytes differ from the request's"
    median = statistics.median(latencies)
    return {
        "requests": float(len(latencies)),
        "requests_per_s": 1 / median,
        "payload_MB_per_s": payload.nbytes / median / 1e6,
        "median_ms": median * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from server.cuda.devices import cupy_module

    cupy = cupy_module()
    if cupy is None:
        print("no CUDA device visible to CuPy: nothing to measure")
        return 0
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = device.decode() if isinstance(device, bytes) else str(device)
    rates = copy_rates(cupy)
    print(f"## GPU data path ({name}, 16 MiB FP32)\n")
    print("| copy | GB/s |\n|---|---|")
    for label, rate in rates.items():
        print(f"| {label} | {rate:.1f} |")
    floor_ms = (NBYTES / rates["H2D pinned"] + NBYTES / rates["D2H pinned"]) / 1e9 * 1e3
    print(f"\npinned H2D + D2H of 16 MiB: {floor_ms:.2f} ms")
    e2e = end_to_end(args.seconds)
    if isinstance(e2e, str):
        print(f"end to end: {e2e}")
    else:
        print(
            f"end to end, HTTP binary, concurrency 1: {e2e['requests_per_s']:.1f} req/s, "
            f"{e2e['payload_MB_per_s']:.0f} MB/s of payload, median {e2e['median_ms']:.1f} ms "
            f"({e2e['median_ms'] / floor_ms:.1f}× the pinned copy floor) over "
            f"{e2e['requests']:.0f} requests"
        )
    if args.json:
        args.json.write_text(json.dumps({"device": name, "copies": rates, "e2e": e2e}, indent=2))
    return 0 if not (isinstance(e2e, str) and e2e.startswith("failed")) else 1


if __name__ == "__main__":
    sys.exit(main())
