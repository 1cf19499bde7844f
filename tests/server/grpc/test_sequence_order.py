"""SequenceOrder: a stream's requests of one sequence run one after the other, in read order;
others do not wait."""

from __future__ import annotations

import asyncio

from server import event_loop
from server.generated import grpc_service_pb2 as pb
from server.grpc.sequence_order import SequenceOrder


def _request(sequence_id: int | str | None, model: str = "m") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    if isinstance(sequence_id, str):
        request.parameters["sequence_id"].string_param = sequence_id
    elif sequence_id is not None:
        request.parameters["sequence_id"].int64_param = sequence_id
    return request


def test_requests_of_one_sequence_wait_for_the_previous_one() -> None:
    order = SequenceOrder()
    events: list[str] = []

    async def handle(name: str, request: pb.ModelInferRequest, delay: float) -> None:
        async with order.turn(request).wait():
            events.append(f"{name} start")
            await asyncio.sleep(delay)
            events.append(f"{name} end")

    async def main() -> None:
        await asyncio.gather(
            handle("a1", _request(1), 0.05),
            handle("a2", _request(1), 0.0),
            handle("b1", _request("x"), 0.0),  # another sequence: does not wait
            handle("none", _request(None), 0.0),  # not in a sequence
            handle("zero", _request(0), 0.0),  # 0 means none
            handle("other", _request(1, "n"), 0.0),  # same id, other model
        )

    event_loop.run(main())
    assert events.index("a2 start") > events.index("a1 end")
    for name in ("b1", "none", "zero", "other"):
        assert events.index(f"{name} end") < events.index("a1 end"), name
    assert not order._last  # nothing kept once the stream's requests are done


def test_a_failed_request_lets_the_next_one_run() -> None:
    order = SequenceOrder()

    async def main() -> bool:
        first_turn = order.turn(_request(7))
        second_turn = order.turn(_request(7))

        async def fail() -> None:
            async with first_turn.wait():
                raise ValueError("model fault")

        first = asyncio.ensure_future(fail())
        async with second_turn.wait():
            assert first.done()
        try:
            await first
        except ValueError:
            return True
        return False

    assert event_loop.run(asyncio.wait_for(main(), 5))
