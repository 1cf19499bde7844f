"""A decoupled model's response sender: any number of responses, then the final flag, after
which it refuses more (python_backend's texts); a response is needed without the flag."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from backends.python.pb_utils.response_sender import InferenceResponseSender


def _sender(sent: list[tuple[Any, bool]]) -> InferenceResponseSender:
    return InferenceResponseSender(
        lambda result, final: sent.append((result, final)),
        lambda response: {t.name(): t.as_numpy() for t in response.output_tensors()},
        lambda: False,
    )


def test_responses_then_the_final_flag_alone() -> None:
    sent: list[tuple[Any, bool]] = []
    sender = _sender(sent)
    out = pb_utils.Tensor("OUT", np.array([1], np.int32))
    sender.send(pb_utils.InferenceResponse([out]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert [final for _, final in sent] == [False, True]
    assert sent[0][0]["OUT"].tolist() == [1] and sent[1][0] is None
    assert sender.closed and not sender.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_a_response_is_needed_without_the_final_flag() -> None:
    sender = _sender([])
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
