"""Benchmark the response cache: the same compute-bearing model answered from the cache (hits)
and computed (misses, and with the cache off), in one run.

The model is an FP32 MLP (``scripts/make_models.mlp``, 1024 -> 8192 -> 1024 by default) sent
32 rows per request, so that one request costs tens of milliseconds of ONNX Runtime (one intra-op
thread). Three cells, each timed ``--repeats`` times at concurrency 1 with NVIDIA's
tritonclient over HTTP (binary tensors):

- ``hit``: ``mlp_cached`` (``response_cache { enable: true }``), the same inputs every time;
- ``miss``: ``mlp_cached``, new random inputs every time, made before the timing (each answer
  is computed, then inserted into the cache);
- ``off``: ``mlp_plain``, the same model file without the cache, the same inputs every time.

Each repeat times the three cells in turn. The table gives, per cell, the min and median over
the repeats of each repeat's median latency, and the speed-up of hits over ``off`` (the issue's goal: at least 10x). The first
hit is checked against the computed answer. Figures are for people, never a CI gate.

    python scripts/bench_cache.py [--repeats 5] [--requests 40] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import PINNED_THREADS, machine_facts

os.environ.update(PINNED_THREADS)  # before numpy and onnxruntime start their thread pools

import numpy as np
import tritonclient.http as httpclient

from scripts import make_models
from scripts.bench_http import ServerUnderTest

CACHE_BYTES = 256 << 20


def write_repository(root: Path, inputs: int, hidden: int, outputs: int) -> None:
    """``mlp_cached`` and ``mlp_plain``: one MLP, with and without the response cache."""
    model = make_models.mlp(inputs, hidden, outputs)
    for name, cached in (("mlp_cached", True), ("mlp_plain", False)):
        make_models.save(model, root / name / "1" / "model.onnx")
        config = make_models.config_pbtxt(
            name, 64, [("INPUT0", "FP32", [inputs])], [("OUTPUT0", "FP32", [outputs])]
        )
        if cached:
            config += "response_cache { enable: true }\n"
        make_models.write_text(config, root / name / "config.pbtxt")


def _call(client: Any, model: str, make_input: Callable[[], np.ndarray]) -> Callable[[], Any]:
    def call() -> Any:
        x = make_input()
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        return client.infer(model, [tensor], outputs=[output]).as_numpy("OUTPUT0")

    return call


def _median_latency(call: Callable[[], Any], requests: int) -> float:
    """The median latency (seconds) of ``requests`` calls."""
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    return statistics.median(latencies)


def run(server: ServerUnderTest, rows: int, width: int, repeats: int, requests: int) -> dict[
    str, list[float]
]:
    client = httpclient.InferenceServerClient(f"{server.address[0]}:{server.address[1]}")
    rng = np.random.default_rng(0)
    fixed = rng.standard_normal((rows, width)).astype(np.float32)
    try:
        computed = _call(client, "mlp_plain", lambda: fixed)()
        hit = _call(client, "mlp_cached", lambda: fixed)
        first_miss = hit()  # fills the cache
        assert np.array_equal(first_miss, computed), "the cached model answers differently"
        assert np.array_equal(hit(), computed), "a cache hit answers differently"
        # New inputs for every miss, made before the clock runs (not timed).
        pool = iter(
            [rng.standard_normal((rows, width)).astype(np.float32) for _ in range(
                repeats * requests
            )]
        )
        fresh = _call(client, "mlp_cached", lambda: next(pool))
        cells = {
            "hit": hit,
            "miss": fresh,
            "off": _call(client, "mlp_plain", lambda: fixed),
        }
        # Each repeat times every cell in turn, so that a busy spell of the shared machine
        # does not fall on one cell alone.
        results: dict[str, list[float]] = {name: [] for name in cells}
        for _ in range(repeats):
            for name, call in cells.items():
                results[name].append(_median_latency(call, requests))
        return results
    finally:
        client.close()


def report(results: dict[str, list[float]], facts: dict[str, str], shape: str,
           repeats: int, requests: int) -> str:
    off = statistics.median(results["off"])
    off_min = min(results["off"])
    lines = [
        "## tensorgate: response cache hits vs computed answers (HTTP binary, concurrency 1)",
        "",
        (f"- machine: nproc {facts['nproc']} ({facts['cpu']}), Python {facts['python']}; "
         "ONNX Runtime and BLAS on one thread"),
        (f"- model: FP32 MLP {shape}; {repeats} repeats of {requests} requests per cell; "
         "latency = each repeat's median"),
        "",
        "| cell | min ms | median ms | req/s (median) | vs off (median) | vs off (min) |",
        "|---|---|---|---|---|---|",
    ]
    for name, medians in results.items():
        median = statistics.median(medians)
        lines.append(
            f"| {name} | {min(medians) * 1e3:.3f} | {median * 1e3:.3f} | {1 / median:.0f} | "
            f"{off / median:.1f}× | {off_min / min(medians):.1f}× |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per cell")
    parser.add_argument("--requests", type=int, default=40, help="requests per repeat")
    parser.add_argument("--rows", type=int, default=32, help="rows per request")
    parser.add_argument("--width", type=int, default=1024, help="MLP input and output width")
    parser.add_argument("--hidden", type=int, default=8192, help="MLP hidden width")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_cache_") as folder:
        root = Path(folder)
        write_repository(root, args.width, args.hidden, args.width)
        server = ServerUnderTest(
            repositories=[root], extra_args=(f"--cache-config=local,size={CACHE_BYTES}",)
        )
        try:
            results = run(server, args.rows, args.width, args.repeats, args.requests)
        finally:
            server.stop()
    shape = f"{args.width}->{args.hidden}->{args.width}, {args.rows} rows per request"
    print(report(results, machine_facts(), shape, args.repeats, args.requests))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
