"""Benchmark system shared memory against sending the bytes: 1 MB and 16 MB FP32 identity,
concurrency 1, over HTTP and gRPC, in one run.

For each size and protocol two clients take turns on the same server (``identity_fp32`` of
the example repository, ``--allow-client-shm=true``): one sends the tensor in the request
(HTTP binary extension, gRPC ``raw_input_contents``) and reads it back from the response; the
other writes it into a registered input region, asks for the output in a second region and
reads it from there (``tritonclient.utils.shared_memory``), as a client on the same node
would. Both use NVIDIA's tritonclient, so client costs are alike; the copies into and out of
the regions are counted, as a real client pays them. Each answer is checked against the input
on the first request of every cell. Figures are for people, never a CI gate.

    python scripts/bench_shm.py [--seconds 3] [--json PATH]

Reference (issue 8): Triton on this machine kind moves 16 MB at concurrency 1 about 3x faster
through system shared memory than over gRPC.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import PINNED_THREADS, machine_facts

os.environ.update(PINNED_THREADS)  # before numpy and onnxruntime start their thread pools

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from scripts.bench_http import ServerUnderTest

MODEL = "identity_fp32"
SIZES = {"1 MB": 1 << 20, "16 MB": 16 << 20}


def _timed(seconds: float, call: Callable[[], None]) -> dict[str, float]:
    """Run ``call`` back to back for ``seconds`` (at least 3 times) after one warm-up call."""
    call()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(latencies) < 3:
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    median = statistics.median(latencies)
    return {"requests": float(len(latencies)), "per_s": 1 / median, "median_ms": median * 1e3}


def _socket_call(client: Any, module: Any, x: np.ndarray, check: list[bool]) -> Callable[[], None]:
    def call() -> None:
        tensor = module.InferInput("INPUT0", list(x.shape), "FP32")
        if module is httpclient:
            tensor.set_data_from_numpy(x, binary_data=True)
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
        else:
            tensor.set_data_from_numpy(x)
            outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
        result = client.infer(MODEL, [tensor], outputs=outputs)
        if not check[0]:
            assert np.array_equal(result.as_numpy("OUTPUT0"), x), "wrong answer over the socket"
            check[0] = True

    return call


def _shm_call(
    client: Any, module: Any, x: np.ndarray, check: list[bool], handles: list[Any]
) -> Callable[[], None]:
    tag = uuid.uuid4().hex[:10]
    in_handle = shm.create_shared_memory_region(f"in_{tag}", f"/tg_in_{tag}", x.nbytes)
    out_handle = shm.create_shared_memory_region(f"out_{tag}", f"/tg_out_{tag}", x.nbytes)
    handles += [in_handle, out_handle]
    client.register_system_shared_memory(f"in_{tag}", f"/tg_in_{tag}", x.nbytes)
    client.register_system_shared_memory(f"out_{tag}", f"/tg_out_{tag}", x.nbytes)

    def call() -> None:
        shm.set_shared_memory_region(in_handle, [x])  # the client's copy in
        tensor = module.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_shared_memory(f"in_{tag}", x.nbytes)
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(f"out_{tag}", x.nbytes)
        client.infer(MODEL, [tensor], outputs=[output])
        answer = np.array(shm.get_contents_as_numpy(out_handle, np.float32, list(x.shape)))
        if not check[0]:
            assert np.array_equal(answer, x), "wrong answer through shared memory"
            check[0] = True

    return call


def run(server: ServerUnderTest, seconds: float) -> list[dict[str, Any]]:
    rows = []
    http_address = f"{server.address[0]}:{server.address[1]}"
    grpc_host, grpc_port = server.grpc_address()
    for label, nbytes in SIZES.items():
        x = np.random.default_rng(0).standard_normal((1, nbytes // 4)).astype(np.float32)
        for name, module, url in (
            ("HTTP", httpclient, http_address),
            ("gRPC", grpcclient, f"{grpc_host}:{grpc_port}"),
        ):
            client = module.InferenceServerClient(url)
            handles: list[Any] = []
            try:
                socket_figures = _timed(seconds, _socket_call(client, module, x, [False]))
                shm_figures = _timed(seconds, _shm_call(client, module, x, [False], handles))
            finally:
                client.unregister_system_shared_memory()
                for handle in handles:
                    shm.destroy_shared_memory_region(handle)
                client.close()
            rows.append(
                {"size": label, "bytes": nbytes, "protocol": name,
                 "socket": socket_figures, "shm": shm_figures}
            )
    return rows


def report(rows: list[dict[str, Any]], facts: dict[str, str], seconds: float) -> str:
    lines = [
        "## tensorgate: system shared memory vs the socket (FP32 identity, concurrency 1)",
        "",
        (
            f"- machine: nproc {facts['nproc']} ({facts['cpu']}), Python {facts['python']}; "
            f"{seconds:g} s per cell; client tritonclient (HTTP and gRPC), on the same cores"
        ),
        (
            "- socket: the tensor in the request and the response; shm: input and output in "
            "registered regions, the client's copies in and out counted"
        ),
        "",
        "| size | protocol | socket req/s | socket MB/s | shm req/s | shm MB/s | shm/socket |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        sock, mem = row["socket"], row["shm"]
        megabytes = row["bytes"] / 1e6
        lines.append(
            f"| {row['size']} | {row['protocol']} | {sock['per_s']:.1f} | "
            f"{sock['per_s'] * megabytes:.0f} | {mem['per_s']:.1f} | {mem['per_s'] * megabytes:.0f}"
            f" | {mem['per_s'] / sock['per_s']:.2f}× |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per cell")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    server = ServerUnderTest(extra_args=("--allow-client-shm=true",))
    try:
        rows = run(server, args.seconds)
    finally:
        server.stop()
    print(report(rows, machine_facts(), args.seconds))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
