"""SequenceBatcher with recording instances: slots, null requests, controls, backlog, the
Oldest strategy, implicit state, the idle reaper and Triton's refusals."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import InstanceRequest, ModelInstance, RequestResult
from server import event_loop
from server.errors import InvalidArgument, Rejected, Unavailable
from server.generated import model_config_pb2 as mc
from server.protocol.sequence_spec import SequenceSpec
from server.scheduling.job import Job
from server.scheduling.sequence import SequenceBatcher

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def _spec(max_batch_size: int, strategy: str = "", extra: str = "") -> SequenceSpec:
    config = mc.ModelConfig()
    text_format.Parse(
        f'name: "m" max_batch_size: {max_batch_size} '
        f"sequence_batching {{ {strategy} {CONTROLS} {extra} }}",
        config,
    )
    return SequenceSpec.from_config(config)


class Recording(ModelInstance):
    """Records every execution's inputs; Y = X + 100 * START, STATE_OUT = STATE_IN + X."""

    def __init__(self) -> None:
        self.runs: list[dict[str, np.ndarray]] = []

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        self.runs.append({name: np.array(value) for name, value in inputs.items()})
        outputs = {"Y": inputs["X"] + 100 * inputs["START"]}
        if "STATE_IN" in inputs:
            outputs["STATE_OUT"] = inputs["STATE_IN"] + inputs["X"]
        return {name: outputs[name] for name in output_names}


def _job(value: int, sequence_id: int | str, start: bool = False, end: bool = False,
         rows: int = 1, outputs: tuple[str, ...] = ("Y",)) -> Job:
    params: dict[str, Any] = {"sequence_id": sequence_id}
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    return Job({"X": np.full((rows, 1), value, dtype=np.int32)}, list(outputs), rows,
               parameters=params)


def _y(result: dict[str, np.ndarray]) -> int:
    return int(result["Y"].ravel()[0])


def test_direct_fills_empty_slots_with_null_requests() -> None:
    instance = Recording()
    batcher = SequenceBatcher("m", [instance], _spec(4))

    async def main() -> None:
        first = await asyncio.gather(
            *(batcher.execute(_job(sid, sid, start=True)) for sid in (1, 2, 3))
        )
        assert [_y(r) for r in first] == [101, 102, 103]
        second = await asyncio.gather(
            batcher.execute(_job(10, 1)), batcher.execute(_job(30, 3, end=True))
        )
        assert [_y(r) for r in second] == [10, 30]

    event_loop.run(main())
    batcher.close()
    assert len(instance.runs) == 2  # one execution per round: the sequences shared them
    run = instance.runs[1]
    assert run["START"].tolist() == [[0], [0], [0]]
    assert run["END"].tolist() == [[False], [False], [True]]
    assert run["READY"].tolist() == [[1.0], [0.0], [1.0]]  # slot 1 is a null request
    assert run["CORRID"].tolist() == [[1], [0], [3]]
    assert run["X"].tolist() == [[10], [0], [30]]
    assert run["CORRID"].dtype == np.uint64 and run["READY"].dtype == np.float32


def test_without_batching_controls_have_one_element() -> None:
    instance = Recording()
    batcher = SequenceBatcher("m", [instance], _spec(0))

    async def main() -> None:
        job = Job({"X": np.full((1,), 5, dtype=np.int32)}, ["Y"],
                  parameters={"sequence_id": "9", "sequence_start": True})
        assert _y(await batcher.execute(job)) == 105

    event_loop.run(main())
    batcher.close()
    assert {name: value.shape for name, value in instance.runs[0].items()} == {
        "X": (1,), "START": (1,), "END": (1,), "READY": (1,), "CORRID": (1,),
    }
    assert instance.runs[0]["CORRID"].tolist() == [9]  # a decimal string id, as a number


def test_a_sequence_without_a_slot_waits_in_the_backlog() -> None:
    instance = Recording()
    batcher = SequenceBatcher("m", [instance], _spec(1))

    async def main() -> None:
        assert _y(await batcher.execute(_job(1, 1, start=True))) == 101
        waiting = asyncio.ensure_future(batcher.execute(_job(2, 2, start=True, end=True)))
        await asyncio.sleep(0.05)
        assert not waiting.done() and batcher.pending == 1
        assert _y(await batcher.execute(_job(3, 1, end=True))) == 3
        assert _y(await waiting) == 102  # it took the freed slot

    event_loop.run(main())
    batcher.close()


def test_oldest_batches_the_candidates_cut_to_a_preferred_size() -> None:
    instance = Recording()
    spec = _spec(4, "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }")
    batcher = SequenceBatcher("m", [instance], spec)

    async def main() -> None:
        results = await asyncio.gather(
            *(batcher.execute(_job(sid, sid, start=True)) for sid in (1, 2, 3))
        )
        assert [_y(r) for r in results] == [101, 102, 103]

    event_loop.run(main())
    batcher.close()
    assert [run["X"].ravel().tolist() for run in instance.runs] == [[1, 2], [3]]
    assert all(run["READY"].min() == 1.0 for run in instance.runs)  # no null requests


def test_implicit_state_follows_each_sequence_and_restarts_at_start() -> None:
    instance = Recording()
    state = 'state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
    batcher = SequenceBatcher("m", [instance], _spec(4, extra=state))

    async def send(value: int, sid: int, **flags: bool) -> int:
        result = await batcher.execute(_job(value, sid, outputs=("Y",), **flags))
        assert list(result) == ["Y"]  # the state output is the batcher's, not the client's
        return _y(result)

    async def main() -> None:
        await asyncio.gather(send(1, 1, start=True), send(10, 2, start=True))
        await asyncio.gather(send(2, 1), send(20, 2))
        await asyncio.gather(send(3, 1), send(30, 2, start=True))

    event_loop.run(main())
    batcher.close()
    assert [run["STATE_IN"].ravel().tolist() for run in instance.runs] == [
        [0, 0], [1, 10], [3, 0],  # sequence 2 started again: zeros
    ]


def test_requests_to_python_style_instances_carry_their_controls() -> None:
    class Requests(ModelInstance):
        takes_requests = True

        def __init__(self) -> None:
            self.seen: list[list[dict[str, Any]]] = []

        def execute(self, inputs: Mapping[str, np.ndarray],
                    output_names: Sequence[str]) -> dict[str, np.ndarray]:
            raise AssertionError("requests are given one by one")

        def execute_requests(self, requests: Sequence[InstanceRequest]) -> list[RequestResult]:
            self.seen.append([{k: v.tolist() for k, v in r.inputs.items()} for r in requests])
            return [{"Y": r.inputs["X"] + r.inputs["CORRID"].astype(np.int32)} for r in requests]

    instance = Requests()
    batcher = SequenceBatcher("m", [instance], _spec(4))

    async def main() -> None:
        await asyncio.gather(*(batcher.execute(_job(0, s, start=True)) for s in (7, 8, 9)))
        results = await asyncio.gather(batcher.execute(_job(1, 7)), batcher.execute(_job(1, 9)))
        assert [_y(r) for r in results] == [8, 10]

    event_loop.run(main())
    batcher.close()
    assert [len(run) for run in instance.seen] == [3, 2]  # no null requests
    assert instance.seen[1][1]["READY"] == [[1.0]] and instance.seen[1][1]["START"] == [[0]]


def test_an_idle_sequence_is_reaped_and_its_slot_freed() -> None:
    batcher = SequenceBatcher(
        "m", [Recording()], _spec(1, extra="max_sequence_idle_microseconds: 50000")
    )

    async def main() -> None:
        await batcher.execute(_job(1, 1, start=True))
        await asyncio.sleep(0.2)
        with pytest.raises(InvalidArgument, match="sequence 1 to model 'm' must specify the START"):
            await batcher.execute(_job(2, 1))
        # the only slot is free again
        assert _y(await batcher.execute(_job(3, 2, start=True, end=True))) == 103

    event_loop.run(main())
    batcher.close()


def test_refusals() -> None:
    batcher = SequenceBatcher("m", [Recording()], _spec(4))

    async def main() -> None:
        with pytest.raises(InvalidArgument, match="must specify a non-zero or non-empty"):
            await batcher.execute(_job(1, 0, start=True))
        with pytest.raises(InvalidArgument, match="must specify batch-size 1"):
            await batcher.execute(_job(1, 5, start=True, rows=2))
        with pytest.raises(InvalidArgument, match="correlation ID 'abc' is not a number"):
            await batcher.execute(_job(1, "abc", start=True))
        with pytest.raises(InvalidArgument, match="for sequence 6 to model 'm' must specify"):
            await batcher.execute(_job(1, 6))

    event_loop.run(main())
    batcher.close()


def test_a_request_cancelled_while_queued_never_runs() -> None:
    instance = Recording()
    batcher = SequenceBatcher("m", [instance], _spec(1))

    async def main() -> None:
        await batcher.execute(_job(1, 1, start=True))
        queued = asyncio.ensure_future(batcher.execute(_job(2, 2, start=True)))  # backlog
        await asyncio.sleep(0.01)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert batcher.pending == 0
        assert _y(await batcher.execute(_job(3, 1, end=True))) == 3

    event_loop.run(main())
    batcher.close()
    assert [run["X"].ravel().tolist() for run in instance.runs] == [[1], [3]]


def test_a_backlogged_sequence_past_its_timeout_is_given_up() -> None:
    batcher = SequenceBatcher("m", [Recording()], _spec(1))

    async def main() -> None:
        await batcher.execute(_job(1, 1, start=True))  # holds the only slot
        job = _job(2, 2, start=True)
        job.timeout_us = 50_000
        with pytest.raises(Rejected) as caught:
            await batcher.execute(job)
        assert caught.value.message == "timeout of the corresponding sequence has been expired"
        with pytest.raises(InvalidArgument, match="for sequence 2 to model 'm' must specify"):
            await batcher.execute(_job(3, 2))
        assert batcher.pending == 0
        assert _y(await batcher.execute(_job(4, 1, end=True))) == 4

    event_loop.run(main())
    batcher.close()


def test_direct_waits_for_slot_utilization_up_to_the_queue_delay() -> None:
    instance = Recording()
    strategy = "direct { max_queue_delay_microseconds: 200000 minimum_slot_utilization: 1.0 }"
    batcher = SequenceBatcher("m", [instance], _spec(2, strategy))

    async def main() -> None:
        started = time.monotonic()
        await batcher.execute(_job(1, 1, start=True))  # one slot of two: waits the delay
        assert time.monotonic() - started >= 0.19
        await asyncio.gather(batcher.execute(_job(2, 1)), batcher.execute(_job(3, 2, start=True)))

    event_loop.run(main())
    batcher.close()
    assert [run["X"].ravel().tolist() for run in instance.runs] == [[1], [2, 3]]


def test_a_decoupled_model_answers_through_its_sink() -> None:
    class Decoupled(ModelInstance):
        takes_requests = True

        def execute(self, inputs: Mapping[str, np.ndarray],
                    output_names: Sequence[str]) -> dict[str, np.ndarray]:
            raise AssertionError("requests are given one by one")

        def execute_requests(self, requests: Sequence[InstanceRequest]) -> list[RequestResult]:
            for request in requests:
                assert request.respond is not None
                request.respond({"Y": request.inputs["X"] + request.inputs["START"]}, True)
            return [{} for _ in requests]

    batcher = SequenceBatcher("m", [Decoupled()], _spec(4))
    sent: list[tuple[Any, bool]] = []

    async def main() -> None:
        job = _job(5, 1, start=True, end=True)
        job.respond = lambda result, final: sent.append((result, final))
        assert await batcher.execute(job) == {}

    event_loop.run(main())
    batcher.close()
    ((result, final),) = sent
    assert final and result["Y"].tolist() == [[6]]


def test_a_state_starts_from_its_initial_data() -> None:
    instance = Recording()
    state = (
        'state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 '
        'dims: [ 1 ] initial_state [ { data_type: TYPE_INT32 dims: [ 1 ] data_file: "f" } ] } ]'
    )
    config = mc.ModelConfig()
    text_format.Parse(f'name: "m" max_batch_size: 2 sequence_batching {{ {CONTROLS} {state} }}',
                      config)
    spec = SequenceSpec.from_config(config, {"STATE_IN": np.array([1000], dtype=np.int32)})
    batcher = SequenceBatcher("m", [instance], spec)

    async def main() -> None:
        for value, start in ((1, True), (2, False), (3, True)):
            await batcher.execute(_job(value, 4, start=start, outputs=("Y",)))

    event_loop.run(main())
    batcher.close()
    assert [run["STATE_IN"].ravel().tolist() for run in instance.runs] == [[1000], [1001], [1000]]


def test_a_forced_stop_answers_the_running_request() -> None:
    gate = threading.Event()

    class Blocking(Recording):
        may_run_inline = False

        def execute(self, inputs: Mapping[str, np.ndarray],
                    output_names: Sequence[str]) -> dict[str, np.ndarray]:
            gate.wait(10)
            return super().execute(inputs, output_names)

    instance = Blocking()
    batcher = SequenceBatcher("m", [instance], _spec(1))

    async def main() -> None:
        running = asyncio.ensure_future(batcher.execute(_job(1, 1, start=True)))
        queued = asyncio.ensure_future(batcher.execute(_job(2, 1)))
        await asyncio.sleep(0.05)
        batcher.close(wait=False)
        gate.set()
        for task in (running, queued):
            with pytest.raises(Unavailable, match="model 'm' was unloaded"):
                await task

    event_loop.run(main())
