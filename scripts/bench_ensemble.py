"""Benchmark an ensemble against the client chaining its steps, and python against ONNX.

One tensorgate serves a repository made here, and ``tritonclient.grpc.aio`` drives it from
this process at a fixed concurrency (8 requests in flight, each loop sending its next
request when its last is answered), on these rows:

- ``ensemble``: ``pipeline``, an ensemble of a Triton-style python pre-processing step
  (``pre``: A = 2 RAW, B = RAW + 1), the ONNX add/sub ``simple`` and a python
  post-processing step (``post``: OUT = 10 SUM - DIFF as FP32), INT32 ``[1, 16]``;
- ``three-calls``: the same three models called by the client one after another (the
  outputs of one sent as the inputs of the next), counted once per finished chain;
- ``add_sub-python`` / ``add_sub-onnx``: NVIDIA's python_backend ``add_sub`` model as Triton's
  example writes it (FP32 ``[4]``, no batching) next to the same function as an ONNX model.

Each row runs ``--seconds`` long, ``--repeat`` times, the rows interleaved; the table shows
the lowest and the median requests/s and the median p50 latency, and the ratios the issue
asks for (ensemble ÷ three calls; python ÷ ONNX).

    python scripts/bench_ensemble.py [--seconds 5] [--repeat 3] [--concurrency 8]
        [--tensorgate-args "--frontends=0"]

Figures are for people, never a CI gate: on a shared 2-core machine the client here takes
its share of the same cores, and only same-run ratios carry from one run to the next. The
server is ``python -m server`` on loopback and free ports, ONNX Runtime and BLAS pinned to
one thread; it is stopped by its PID, also on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

import numpy as np
import tritonclient.grpc.aio as grpcaio

from scripts import make_models
from scripts.bench_common import fmt_number, fmt_ratio, interpreter_line, markdown_table
from scripts.bench_vs_triton import Tensorgate

ROWS = ("ensemble", "three-calls", "add_sub-python", "add_sub-onnx")

_STEP = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            {body}
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''
_PRE = _STEP.format(body='''raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            outputs = [pb_utils.Tensor("A", raw * 2), pb_utils.Tensor("B", raw + 1)]''')
_POST = _STEP.format(body='''total = pb_utils.get_input_tensor_by_name(request, "SUM").as_numpy()
            diff = pb_utils.get_input_tensor_by_name(request, "DIFF").as_numpy()
            outputs = [pb_utils.Tensor("OUT", (total * 10 - diff).astype(np.float32))]''')
# NVIDIA's add_sub example, as its README describes it: FP32 [4] in, sum and difference out
_ADD_SUB = _STEP.format(body='''in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", in0 + in1), pb_utils.Tensor("OUTPUT1", in0 - in1)]''')


def _python_config(name: str, batch: int, inputs: str, outputs: str) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {batch}\n'
        f"input [ {inputs} ]\noutput [ {outputs} ]\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )


def _tensor(name: str, datatype: str, dims: str) -> str:
    return f'{{ name: "{name}" data_type: TYPE_{datatype} dims: [ {dims} ] }}'


_PIPELINE = """name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1
    input_map { key: "RAW" value: "RAW" }
    output_map { key: "A" value: "a" } output_map { key: "B" value: "b" } },
  { model_name: "simple" model_version: -1
    input_map { key: "INPUT0" value: "a" } input_map { key: "INPUT1" value: "b" }
    output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "diff" } },
  { model_name: "post" model_version: -1
    input_map { key: "SUM" value: "sum" } input_map { key: "DIFF" value: "diff" }
    output_map { key: "OUT" value: "OUT" } }
] }
"""


def write_repository(root: Path) -> Path:
    """``pre``, ``simple`` (ONNX), ``post``, ``pipeline``; ``add_sub`` and ``add_sub_onnx``."""
    int16 = ("INT32", "16")
    make_models.write_text(
        _python_config(
            "pre", 8, _tensor("RAW", *int16), f"{_tensor('A', *int16)}, {_tensor('B', *int16)}"
        ),
        root / "pre" / "config.pbtxt",
    )
    make_models.write_text(_PRE, root / "pre" / "1" / "model.py")
    make_models.write_text(
        _python_config(
            "post", 8, f"{_tensor('SUM', *int16)}, {_tensor('DIFF', *int16)}",
            _tensor("OUT", "FP32", "16"),
        ),
        root / "post" / "config.pbtxt",
    )
    make_models.write_text(_POST, root / "post" / "1" / "model.py")
    simple = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]
    make_models.write_text(
        make_models.config_pbtxt(
            "simple", 8, simple, [("OUTPUT0", "INT32", [16]), ("OUTPUT1", "INT32", [16])]
        ),
        root / "simple" / "config.pbtxt",
    )
    make_models.save(make_models.add_sub("INT32", 16), root / "simple" / "1" / "model.onnx")
    make_models.write_text(_PIPELINE, root / "pipeline" / "config.pbtxt")
    (root / "pipeline" / "1").mkdir(parents=True)
    fp4 = [(name, "FP32", [4]) for name in ("INPUT0", "INPUT1")]
    outs = [(name, "FP32", [4]) for name in ("OUTPUT0", "OUTPUT1")]
    make_models.write_text(
        _python_config(
            "add_sub", 0, ", ".join(_tensor(n, "FP32", "4") for n, _, _ in fp4),
            ", ".join(_tensor(n, "FP32", "4") for n, _, _ in outs),
        ),
        root / "add_sub" / "config.pbtxt",
    )
    make_models.write_text(_ADD_SUB, root / "add_sub" / "1" / "model.py")
    make_models.write_text(
        make_models.config_pbtxt("add_sub_onnx", 0, fp4, outs),
        root / "add_sub_onnx" / "config.pbtxt",
    )
    make_models.save(
        make_models.add_sub("FP32", 4, batch=False), root / "add_sub_onnx" / "1" / "model.onnx"
    )
    return root


def _inputs(values: dict[str, np.ndarray]) -> list[grpcaio.InferInput]:
    tensors = []
    for name, array in values.items():
        datatype = "FP32" if array.dtype == np.float32 else "INT32"
        tensor = grpcaio.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _outputs(*names: str) -> list[grpcaio.InferRequestedOutput]:
    return [grpcaio.InferRequestedOutput(name) for name in names]


Call = Callable[[grpcaio.InferenceServerClient], Awaitable[None]]
_RAW = np.arange(16, dtype=np.int32).reshape(1, 16)
_EXPECTED = (29 * _RAW + 11).astype(np.float32)  # 10 (3 RAW + 1) - (RAW - 1)
_X = np.array([1, 2, 3, 4], np.float32)


async def _ensemble(client: grpcaio.InferenceServerClient) -> None:
    result = await client.infer("pipeline", _inputs({"RAW": _RAW}), outputs=_outputs("OUT"))
    _check(result.as_numpy("OUT"), _EXPECTED)


async def _three_calls(client: grpcaio.InferenceServerClient) -> None:
    pre = await client.infer("pre", _inputs({"RAW": _RAW}), outputs=_outputs("A", "B"))
    mid = await client.infer(
        "simple",
        _inputs({"INPUT0": pre.as_numpy("A"), "INPUT1": pre.as_numpy("B")}),
        outputs=_outputs("OUTPUT0", "OUTPUT1"),
    )
    post = await client.infer(
        "post",
        _inputs({"SUM": mid.as_numpy("OUTPUT0"), "DIFF": mid.as_numpy("OUTPUT1")}),
        outputs=_outputs("OUT"),
    )
    _check(post.as_numpy("OUT"), _EXPECTED)


def _add_sub(model: str) -> Call:
    async def call(client: grpcaio.InferenceServerClient) -> None:
        result = await client.infer(
            model, _inputs({"INPUT0": _X, "INPUT1": _X}), outputs=_outputs("OUTPUT0", "OUTPUT1")
        )
        _check(result.as_numpy("OUTPUT0"), _X * 2)

    return call


CALLS: dict[str, Call] = {
    "ensemble": _ensemble,
    "three-calls": _three_calls,
    "add_sub-python": _add_sub("add_sub"),
    "add_sub-onnx": _add_sub("add_sub_onnx"),
}


def _check(got: np.ndarray | None, expected: np.ndarray) -> None:
    if got is None or not np.array_equal(got, expected):
        raise AssertionError(f"wrong answer: {got} (expected {expected})")


@dataclass(frozen=True)
class Run:
    row: str
    rate: float  # finished calls (chains for three-calls) per second
    p50_ms: float


async def measure(url: str, row: str, concurrency: int, seconds: float) -> Run:
    """``concurrency`` loops of ``row``'s call for ``seconds`` (after a short warm-up)."""
    call = CALLS[row]
    client = grpcaio.InferenceServerClient(url)
    latencies: list[float] = []
    try:
        for _ in range(concurrency):
            await call(client)  # warm-up: connections, the models' first runs
        deadline = time.monotonic() + seconds

        async def loop() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                await call(client)
                latencies.append(time.perf_counter() - started)

        started = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    finally:
        await client.close()
    return Run(row, len(latencies) / elapsed, statistics.median(latencies) * 1e3)


def report(runs: list[Run], concurrency: int) -> str:
    rates = {row: [r.rate for r in runs if r.row == row] for row in ROWS}
    lines = []
    table = []
    for row in ROWS:
        values = rates[row]
        p50 = statistics.median(r.p50_ms for r in runs if r.row == row)
        table.append([
            row, fmt_number(min(values)), fmt_number(statistics.median(values)), f"{p50:.2f}"
        ])
    lines.append(markdown_table(
        [f"gRPC, concurrency {concurrency}", "min /s", "median /s", "median p50 ms"], table
    ))
    ensemble = statistics.median(rates["ensemble"]) / statistics.median(rates["three-calls"])
    python = statistics.median(rates["add_sub-python"]) / statistics.median(rates["add_sub-onnx"])
    lines.append("")
    lines.append(f"ensemble ÷ three calls: {fmt_ratio(ensemble)} (goal ≥ 1.5×)")
    lines.append(f"add_sub python ÷ ONNX: {fmt_ratio(python)}")
    lines.append(interpreter_line("the server"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tensorgate-args", default="", help="more server flags")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.repeat < 1 or args.concurrency < 1:
        parser.error("--seconds, --repeat and --concurrency must be positive")
    with tempfile.TemporaryDirectory(prefix="bench-ensemble-") as folder:
        repository = write_repository(Path(folder) / "models")
        server = Tensorgate(repository, shlex.split(args.tensorgate_args))
        try:
            server.wait_ready()
            url = f"127.0.0.1:{server.grpc_port}"
            runs = []
            for round_ in range(args.repeat):
                for row in ROWS:
                    run = asyncio.run(measure(url, row, args.concurrency, args.seconds))
                    print(f"round {round_ + 1} {row}: {run.rate:.0f}/s, p50 {run.p50_ms:.2f} ms",
                          file=sys.stderr, flush=True)
                    runs.append(run)
        finally:
            server.stop()
    print(report(runs, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
