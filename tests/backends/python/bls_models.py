"""Triton-style python models for the BLS and decoupled tests, written from the behaviour
NVIDIA's python_backend examples describe (``examples/decoupled``: repeat, square; BLS: a
model calling another), and the repositories they make."""

from __future__ import annotations

from pathlib import Path

from scripts import make_models

# Decoupled: one response per element of IN (OUT = IN[i], IDX = i), each after DELAY[i] ms,
# sent from a thread of its own after execute has returned; WAIT ms after the last one, the
# final flag alone.
REPEAT_CONFIG = """name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
REPEAT = """import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().copy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().copy()
            if values.shape != delays.shape:
                error = pb_utils.TritonError("IN and DELAY must have the same shape")
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            thread = threading.Thread(
                target=self.respond,
                args=(request.get_response_sender(), values, delays, int(wait[0])),
            )
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, values, delays, wait_ms):
        for index, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000)
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([index], np.uint32)),
            ]))
        time.sleep(wait_ms / 1000)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""
# Decoupled: N responses of OUT = N for input N, each with the response parameter "left" (how
# many follow), sent from execute, then the final flag alone;
# a negative N is answered by one error response, flagged final (-2: execute raises).
SQUARE_CONFIG = """name: "square_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
SQUARE = """import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if n == -2:
                raise RuntimeError("square gave up")
            if n < 0:
                error = pb_utils.TritonError(f"cannot send {n} responses", 3)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([n], np.int32))],
                    parameters={"left": n - i - 1},
                ))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if n == 7:  # works on after its final response (a model may)
                time.sleep(0.3)
"""
DOUBLE_CONFIG = """name: "double"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
DOUBLE = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2
            )])
            for r in requests
        ]
"""
# BLS: the request parameter "target" names the model to call with IN (its OUT comes back as
# ours, its error as ours); "mode" = "stream" calls square_int32 decoupled with IN[0] and
# answers the values it sent (-1 for an empty response: the final flag alone); "first" calls
# repeat_int32 decoupled (a response at once, one a second later) and answers the ms until
# exec returned and until the last response; "cancel" cancels that call after its first
# response and answers how many responses it saw then and the ms it took; "control" reports
# is_model_ready around an unload and a load of the target; "bytes_name" names the target as bytes (an element of a BYTES input is), "wide"
# answers OUT as INT64 although the config says INT32 (Triton sends what the model made);
# "params" answers with response parameters, "forward" asks the target for them (mode "params")
# and answers with the target's.
# One instance: a call to itself must not hang.
BLS_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
BLS = """import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def answer(values, dtype=np.int32, parameters=None):
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("OUT", np.array(values, dtype))], parameters=parameters
    )


class TritonPythonModel:
    ASYNC def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            target = params.get("target", "double")
            mode = params.get("mode", "")
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if mode == "control":
                before = pb_utils.is_model_ready(target)
                pb_utils.unload_model(target)
                unloaded = pb_utils.is_model_ready(target)
                pb_utils.load_model(target)
                responses.append(answer([before, unloaded, pb_utils.is_model_ready(target)]))
                continue
            if mode == "params":
                responses.append(answer(x, parameters={"bool": True, "int": 7, "str": "seven"}))
                continue
            if mode in ("first", "cancel"):
                started = time.monotonic()
                call = pb_utils.InferenceRequest(
                    model_name="repeat_int32", requested_output_names=["OUT", "IDX"],
                    inputs=[
                        pb_utils.Tensor("IN", np.array([1, 2], np.int32)),
                        pb_utils.Tensor("DELAY", np.array([0, 1000], np.uint32)),
                        pb_utils.Tensor("WAIT", np.array([0], np.uint32)),
                    ],
                )
                replies = AWAIT call.EXEC(decoupled=True)
                returned = time.monotonic()
                if mode == "cancel":
                    next(replies)
                    replies.cancel()
                    seen = 1 + len(list(replies))
                    responses.append(answer([seen, (time.monotonic() - started) * 1000]))
                    continue
                count = len(list(replies))
                responses.append(answer([
                    count, (returned - started) * 1000, (time.monotonic() - started) * 1000
                ]))
                continue
            if mode == "stream":
                call = pb_utils.InferenceRequest(
                    model_name="square_int32", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", x[:1])],
                )
                values = []
                replies = AWAIT call.EXEC(decoupled=True)
                for reply in replies:
                    if reply.has_error():
                        return [pb_utils.InferenceResponse(error=reply.error())]
                    if not reply.output_tensors():  # the final flag alone: an empty response
                        values.append(-1)
                        continue
                    values.append(int(pb_utils.get_output_tensor_by_name(reply, "OUT").as_numpy()[0]))
                if len(list(replies)) != len(values):  # iterated again: the same responses
                    raise pb_utils.TritonModelException("a second iteration differs")
                responses.append(answer(values))
                continue
            call = pb_utils.InferenceRequest(
                model_name=target.encode() if mode == "bytes_name" else target,
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", x)], request_id="from-bls",
                parameters={"mode": "params"} if mode == "forward" else {},
            )
            reply = AWAIT call.EXEC()
            if reply.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(reply.error().message(), reply.error().code())
                ))
                continue
            out = pb_utils.get_output_tensor_by_name(reply, "OUT").as_numpy()
            responses.append(answer(
                out, np.int64 if mode == "wide" else np.int32, json.loads(reply.parameters())
            ))
        return responses
"""


def _bls(name: str, asynchronous: bool) -> tuple[str, str]:
    code = BLS.replace("ASYNC ", "async " if asynchronous else "")
    code = code.replace("AWAIT ", "await " if asynchronous else "")
    code = code.replace(".EXEC(", ".async_exec(" if asynchronous else ".exec(")
    return BLS_CONFIG.format(name=name), code


MODELS = {
    "repeat_int32": (REPEAT_CONFIG, REPEAT),
    "square_int32": (SQUARE_CONFIG, SQUARE),
    "double": (DOUBLE_CONFIG, DOUBLE),
    "spare": (DOUBLE_CONFIG.replace('name: "double"', 'name: "spare"'), DOUBLE),
    "bls": _bls("bls", asynchronous=False),
    "bls_async": _bls("bls_async", asynchronous=True),
}


def write_repository(root: Path) -> Path:
    for name, (config, code) in MODELS.items():
        make_models.write_text(config, root / name / "config.pbtxt")
        make_models.write_text(code, root / name / "1" / "model.py")
    return root
