"""Run NVIDIA's image classification client examples, unchanged, against tensorgate.

Given a checkout of triton-inference-server/client (``git clone`` it anywhere), this writes a
model repository of densenet_onnx-style classifiers (no download: ``make_models.image_classifier``
gives each densenet's or inception's inputs, outputs, config and a label file of its own), two
JPEG images, starts tensorgate on it in each process layout, and runs ``image_client.py`` (HTTP
and gRPC; sync, async and streaming) and ``grpc_image_client.py`` (sync, async, streaming) from
``src/python/examples`` with ``-c 3``, batch sizes 1 and 2 and each scaling. It prints one line
per invocation and layout.

An invocation passes when the client prints ``PASS`` and every class it printed carries the
label of its index in the model's label file; one the server must refuse passes when the
client fails with the server's text. Across invocations, the same images, scaling and model
must give the same classes, in every layout. With ``--triton SERVE_SH`` (the triton-ref
tool's ``serve.sh``), the same invocations also run against NVIDIA's Triton on the same
repository, and each must print what it printed there.

    python scripts/run_client_examples.py /path/to/client [--layout split] [--triton SERVE_SH]

Not a CI test (CI cannot fetch the client repository); the behaviours the examples need are
covered by tests written here. The clients need ``tritonclient``, ``pillow`` and ``attrdict``
in ``--python``. Exit status 0 when every invocation passed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from scripts import make_models
from scripts.example_runs import (
    LAYOUTS,
    free_ports,
    run_client,
    serving,
    tensorgate_command,
)

_CLIENT_S = 120.0
#: A class as the clients print it: ``    <score> (<index>) = <label>``.
_CLASS_LINE = re.compile(r"^    (\S+) \((\d+)\) = (.*)$")


@dataclass(frozen=True)
class ClassifierModel:
    """One model of the repository: its config (Triton's for densenet_onnx and inception_onnx,
    varied in batching), and how ``image_classifier`` builds its ONNX file."""

    name: str
    config: str
    labels: str
    channels_last: bool = False
    batch: bool = True

    @property
    def family(self) -> str:
        """Models of one family compute the same scores for the same image."""
        return "inception" if self.channels_last else "densenet"

    def write(self, root: Path) -> None:
        folder = root / self.name
        if self.channels_last:
            model = make_models.image_classifier(
                "input", "InceptionV3/Predictions/Softmax", (299, 299, 3), (1001,),
                channels_last=True, batch=self.batch,
            )
        else:
            model = make_models.image_classifier(batch=self.batch)
        make_models.save(model, folder / "1" / "model.onnx")
        make_models.write_text(self.config, folder / "config.pbtxt")
        classes = 1001 if self.channels_last else 1000
        make_models.write_text(
            "".join(f"{self.family.upper()} CLASS {i:04d}\n" for i in range(classes)),
            folder / self.labels,
        )


def _densenet_config(name: str, max_batch_size: int, scheduler: str = "") -> str:
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size : {max_batch_size}
input [
  {{
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }}
]
output [
  {{
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape {{ shape: [ 1000, 1, 1 ] }}
    label_filename: "densenet_labels.txt"
  }}
]
{scheduler}"""


_INCEPTION_CONFIG = """name: "inception_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 128
input [
  {
    name: "input"
    data_type: TYPE_FP32
    format: FORMAT_NHWC
    dims: [ 299, 299, 3 ]
  }
]
output [
  {
    name: "InceptionV3/Predictions/Softmax"
    data_type: TYPE_FP32
    dims: [ 1001 ]
    label_filename: "inception_labels.txt"
  }
]
"""

MODELS = {
    model.name: model
    for model in (
        # Triton's quickstart model, config as Triton ships it (max_batch_size 1).
        ClassifierModel("densenet_onnx", _densenet_config("densenet_onnx", 1),
                        "densenet_labels.txt"),
        ClassifierModel(
            "densenet_batching", _densenet_config("densenet_batching", 8, "dynamic_batching { }\n"),
            "densenet_labels.txt",
        ),
        ClassifierModel("densenet_nobatch", _densenet_config("densenet_nobatch", 0),
                        "densenet_labels.txt", batch=False),
        ClassifierModel("inception_onnx", _INCEPTION_CONFIG, "inception_labels.txt",
                        channels_last=True),
    )
}


@dataclass(frozen=True)
class Invocation:
    """One run of a client: which script, how it talks to the server, and what it asks."""

    script: str  # image_client.py or grpc_image_client.py
    model: str
    protocol: str = "HTTP"
    mode: str = "sync"  # sync, async or streaming
    batch: int = 1
    scaling: str = "INCEPTION"
    refused: str | None = None  # the server's refusal the client must print

    @property
    def name(self) -> str:
        client = self.script.removesuffix(".py")
        return f"{client} {self.protocol} {self.mode} {self.model} -b {self.batch} -s {self.scaling}"

    def arguments(self, http: str, grpc: str, images: Path) -> list[str]:
        """The client's command line; batch 2 sends both images, batch 1 one of them."""
        url = http if self.protocol == "HTTP" else grpc
        args = ["-m", self.model, "-c", "3", "-s", self.scaling, "-b", str(self.batch), "-u", url]
        if self.script == "image_client.py":
            args += ["-i", self.protocol]
        args += {"sync": [], "async": ["-a"], "streaming": ["--streaming"]}[self.mode]
        return [*args, str(images if self.batch > 1 else images / "mug.jpg")]


_MODES = (
    ("image_client.py", "HTTP", "sync"),
    ("image_client.py", "HTTP", "async"),
    ("image_client.py", "gRPC", "sync"),
    ("image_client.py", "gRPC", "async"),
    ("image_client.py", "gRPC", "streaming"),
    ("grpc_image_client.py", "gRPC", "sync"),
    ("grpc_image_client.py", "gRPC", "async"),
    ("grpc_image_client.py", "gRPC", "streaming"),
)
_TOO_LARGE = "inference request batch-size must be <= 1 for 'densenet_onnx'"
INVOCATIONS = (
    *(Invocation(script, "densenet_onnx", protocol, mode) for script, protocol, mode in _MODES),
    *(
        Invocation(script, "densenet_onnx", protocol, scaling=scaling)
        for script, protocol, _ in (_MODES[0], _MODES[2], _MODES[5])
        for scaling in ("VGG", "NONE")
    ),
    Invocation("image_client.py", "densenet_onnx", "HTTP", batch=2, refused=_TOO_LARGE),
    Invocation("image_client.py", "densenet_onnx", "gRPC", "streaming", 2, refused=_TOO_LARGE),
    *(Invocation(s, "densenet_batching", p, m, batch=2) for s, p, m in _MODES),
    *(Invocation(s, "densenet_nobatch", p, m) for s, p, m in _MODES[::2]),
    *(Invocation(s, "inception_onnx", p, m, batch=2) for s, p, m in _MODES[1::2]),
)


def write_images(folder: Path) -> Path:
    """Two JPEGs (``mug.jpg``, ``cup.jpg``) of fixed gradients, so they classify apart."""
    from PIL import Image  # the clients' own dependency; only this script needs it here

    folder.mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[0:300, 0:400]
    pixels = np.stack([x * 255 // 400, y * 255 // 300, (x + y) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(pixels).save(folder / "mug.jpg", quality=90)
    Image.fromarray(np.ascontiguousarray(pixels[::-1, ::-1])).save(folder / "cup.jpg", quality=90)
    return folder


def write_repository(root: Path) -> Path:
    for model in MODELS.values():
        model.write(root)
    return root


@dataclass(frozen=True)
class Outcome:
    """An invocation's verdict on one server, and what it printed there."""

    passed: bool
    why: str
    classes: tuple[str, ...]  # the class lines the client printed, in order
    printed: tuple[str, ...]  # every line it printed


def judge(invocation: Invocation, passed: bool, output: str, last: str) -> Outcome:
    """Whether the client did what it should, from its exit status and output."""
    lines = tuple(output.splitlines())
    classes = tuple(line for line in lines if _CLASS_LINE.match(line))

    def outcome(ok: bool, why: str) -> Outcome:
        return Outcome(ok, why, classes, lines)

    if invocation.refused is not None:
        if passed:
            return outcome(False, "the server did not refuse it")
        if not any(invocation.refused in line for line in lines):
            return outcome(False, f"not refused with the server's text: {last}")
        return outcome(True, last)
    if not passed or last != "PASS":
        return outcome(False, last)
    model = MODELS[invocation.model]
    expected = 3 * invocation.batch
    if len(classes) != expected:
        return outcome(False, f"{len(classes)} classes printed, not {expected}")
    for line in classes:
        match = _CLASS_LINE.match(line)
        assert match is not None
        label = f"{model.family.upper()} CLASS {int(match[2]):04d}"
        if match[3] != label:
            return outcome(False, f"class {match[2]} labelled {match[3]!r}, not {label!r}")
    return outcome(True, last)


def run_on(
    server: str, command: list[str], ports: list[int], examples: Path, images: Path,
    python: str, log_dir: Path,
) -> dict[Invocation, Outcome]:
    """Every invocation against one server (``command``, listening on ``ports``)."""
    http, grpc = f"localhost:{ports[0]}", f"localhost:{ports[1]}"
    with serving(command, http, log_dir / f"{server}.server.log") as why:
        if why is not None:
            return {i: Outcome(False, why, (), ()) for i in INVOCATIONS}
        outcomes = {}
        for number, invocation in enumerate(INVOCATIONS):
            run = run_client(
                [python, invocation.script, *invocation.arguments(http, grpc, images)],
                examples, log_dir / f"{server}-{number:02d}.client.log", _CLIENT_S,
            )
            outcomes[invocation] = judge(invocation, run.passed, run.output, run.last)
    return outcomes


def check_agreement(results: dict[str, dict[Invocation, Outcome]]) -> dict[tuple[str, Invocation], str]:
    """Why an outcome disagrees with the others: the same images, scaling and family must
    print the same classes on every server (layout) and through every client and mode."""
    groups: dict[tuple[str, int, str], set[tuple[str, ...]]] = defaultdict(set)
    for outcomes in results.values():
        for invocation, outcome in outcomes.items():
            if outcome.passed and invocation.refused is None:
                key = (MODELS[invocation.model].family, invocation.batch, invocation.scaling)
                groups[key].add(outcome.classes)
    disagreements = {}
    for server, outcomes in results.items():
        for invocation, outcome in outcomes.items():
            key = (MODELS[invocation.model].family, invocation.batch, invocation.scaling)
            if outcome.passed and invocation.refused is None and len(groups[key]) > 1:
                disagreements[server, invocation] = "classes differ from another run's"
    return disagreements


def _first_difference(reference: Outcome, outcome: Outcome) -> str:
    """Triton's first line that this run did not print the same."""
    for theirs, ours in zip(reference.printed, outcome.printed):
        if theirs != ours:
            return theirs
    return f"{len(reference.printed)} lines, not {len(outcome.printed)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a triton-inference-server/client checkout")
    parser.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the server and the clients")
    parser.add_argument("--triton", type=Path, metavar="SERVE_SH",
                        help="triton-ref's serve.sh: also run against Triton and compare")
    parser.add_argument("--logs", type=Path, help="keep server and client logs here")
    args = parser.parse_args(argv)
    examples = args.checkout / "src" / "python" / "examples"
    if not (examples / "image_client.py").is_file():
        parser.error(f"no src/python/examples/image_client.py in {args.checkout}")
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="client-examples-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    results: dict[str, dict[Invocation, Outcome]] = {}
    with tempfile.TemporaryDirectory(prefix="client-examples-") as work:
        repository = write_repository(Path(work) / "models")
        images = write_images(Path(work) / "images")
        for layout in layouts:
            ports = free_ports(3)
            command = [
                *tensorgate_command(args.python, repository, layout),
                f"--http-port={ports[0]}", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}",
            ]
            results[layout] = run_on(
                layout, command, ports, examples, images, args.python, log_dir
            )
        triton = None
        if args.triton is not None:
            ports = free_ports(3)
            command = [
                "bash", str(args.triton), f"--model-repository={repository}",
                f"--http-port={ports[0]}", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}",
            ]
            triton = run_on("triton", command, ports, examples, images, args.python, log_dir)
    disagreements = check_agreement(results)
    failed = 0
    for layout, outcomes in results.items():
        for invocation, outcome in outcomes.items():
            why = disagreements.get((layout, invocation))
            reference = triton[invocation] if triton is not None else None
            if why is None and reference is not None and reference.printed != outcome.printed:
                why = f"Triton printed otherwise: {_first_difference(reference, outcome)}"
            passed = outcome.passed and why is None
            failed += not passed
            verdict = "PASS" if passed else "FAIL"
            print(f"{verdict}  {layout:11}  {invocation.name:62} {(why or outcome.why)[:90]}",
                  flush=True)
    print(f"logs in {log_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
