"""Models for the warmup tests: python models that write down every execute call they get,
and the repository folders that hold them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from scripts import make_models
from tests.server_process import EXAMPLES

#: The file, in the model's folder, where a recording model appends one JSON line per call.
CALLS = "calls.jsonl"

# OUT = IN for each request. Each execute call appends {"instance", "requests", "shapes",
# "values"} to <model folder>/calls.jsonl: which instance, how many requests, and each
# request's IN shape and first values. IN < 0 answers that request with an error; IN == 7
# raises in execute.
RECORDER = """
import json
import os
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = uuid.uuid4().hex
        self.path = os.path.join(args["model_repository"], "calls.jsonl")

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        with open(self.path, "a") as f:
            f.write(json.dumps({
                "instance": self.instance,
                "requests": len(requests),
                "shapes": [list(x.shape) for x in inputs],
                "values": [x.ravel()[:4].tolist() for x in inputs],
            }) + "\\n")
        if any((x == 7).any() for x in inputs):
            raise ValueError("seven is not welcome")
        responses = []
        for x in inputs:
            if (x < 0).any():
                error = pb_utils.TritonError("negative input")
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return responses
"""

# The same for a decoupled model: one response per request, from a thread, then the final flag.
DECOUPLED_RECORDER = """
import json
import os
import threading
import uuid

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = uuid.uuid4().hex
        self.path = os.path.join(args["model_repository"], "calls.jsonl")

    def execute(self, requests):
        with open(self.path, "a") as f:
            f.write(json.dumps({"instance": self.instance, "requests": len(requests)}) + "\\n")
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            threading.Thread(target=self._answer, args=(request.get_response_sender(), x)).start()
        return None

    def _answer(self, sender, x):
        if (x < 0).any():
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative")))
        else:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def recorder_config(
    name: str, warmup: str, instances: int = 2, max_batch_size: int = 8, extra: str = ""
) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n{extra}\n{warmup}\n"
    )


def add_recorder(
    root: Path, name: str, warmup: str, instances: int = 2, code: str = RECORDER, extra: str = ""
) -> Path:
    folder = root / name
    make_models.write_text(recorder_config(name, warmup, instances, extra=extra),
                           folder / "config.pbtxt")
    make_models.write_text(code, folder / "1" / "model.py")
    return folder


def calls(folder: Path) -> list[dict[str, object]]:
    """The execute calls a recording model wrote down, in order."""
    path = folder / CALLS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def add_simple(root: Path, name: str, warmup: str, instances: int = 1) -> Path:
    """A copy of the example ``simple`` model (INT32 INPUT0 + INPUT1 [16], max_batch_size 8)
    with ``warmup`` and ``instances`` CPU instances added to its config."""
    folder = root / name
    shutil.copytree(EXAMPLES / "simple", folder)
    config = (folder / "config.pbtxt").read_text().replace('name: "simple"', f'name: "{name}"')
    config += f"\ninstance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n{warmup}\n"
    (folder / "config.pbtxt").write_text(config)
    return folder


#: Both inputs of ``simple``, zeros; with the batch size and count as arguments.
SIMPLE_WARMUP = """model_warmup [ {{ name: "zeros" batch_size: {batch_size} count: {count}
  inputs {{ key: "INPUT0" value: {{ data_type: TYPE_INT32 dims: [ 16 ] zero_data: true }} }}
  inputs {{ key: "INPUT1" value: {{ data_type: TYPE_INT32 dims: [ 16 ] random_data: true }} }}
}} ]"""


def warmup_of(name: str, kind: str = "zero_data: true", batch_size: int = 1, count: int = 1,
              key: str = "IN") -> str:
    """One sample of ``IN`` [4] INT32 (``kind`` its data)."""
    return (
        f'model_warmup [ {{ name: "{name}" batch_size: {batch_size} count: {count}\n'
        f'  inputs {{ key: "{key}" value: {{ data_type: TYPE_INT32 dims: [ 4 ] {kind} }} }} }} ]'
    )


def add_warmup_file(folder: Path, name: str, values: list[int]) -> Path:
    """``values`` as raw INT32 bytes in the model's ``warmup/`` folder."""
    path = folder / "warmup" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.asarray(values, dtype=np.int32).tobytes())
    return path
