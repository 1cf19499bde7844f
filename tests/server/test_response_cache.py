"""The response cache on its own: what its key covers, LRU eviction by bytes, an answer
larger than the cache, and that entries are copies."""

from __future__ import annotations

import numpy as np
import pytest

from server.protocol import datatypes
from server.protocol.types import InputTensor, OutputTensor
from server.response_cache import ENTRY_OVERHEAD, ResponseCache, key

INT32 = datatypes.from_name("INT32")
UINT32 = datatypes.from_name("UINT32")
BYTES = datatypes.from_name("BYTES")


def _inputs(a: np.ndarray | None = None, b: np.ndarray | None = None) -> list[InputTensor]:
    a = np.arange(4, dtype=np.int32) if a is None else a
    b = np.ones(4, dtype=np.int32) if b is None else b
    return [InputTensor("A", INT32, a.shape, a), InputTensor("B", INT32, b.shape, b)]


def _key(
    inputs: list[InputTensor] | None = None,
    model: str = "m",
    version: int = 1,
    outputs: dict[str, int] | None = None,
    parameters: dict[str, object] | None = None,
    load: int = 1,
) -> bytes:
    return key(
        model, version, load, _inputs() if inputs is None else inputs,
        {"OUT": 0} if outputs is None else outputs, parameters or {},
    )


def test_the_same_request_has_the_same_key_whatever_its_input_order() -> None:
    assert _key() == _key(list(reversed(_inputs())))
    assert len(_key()) == 32


def test_every_part_of_a_request_that_can_change_its_answer_changes_the_key() -> None:
    base = _key()
    a = np.arange(4, dtype=np.int32)
    variants = {
        "model": _key(model="n"),
        "version": _key(version=2),
        "another load of the version": _key(load=2),
        "bytes": _key(_inputs(a=np.array([0, 1, 2, 4], dtype=np.int32))),
        "shape": _key(_inputs(a=a.reshape(2, 2))),
        "datatype": _key([InputTensor("A", UINT32, a.shape, a.view(np.uint32)), _inputs()[1]]),
        "name": _key([InputTensor("C", INT32, a.shape, a), _inputs()[1]]),
        "an input fewer": _key(_inputs()[:1]),
        "outputs asked for": _key(outputs={"OUT": 0, "OUT2": 0}),
        "class count": _key(outputs={"OUT": 3}),
        "a parameter the model reads": _key(parameters={"temperature": 0.5}),
    }
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants)


def test_scheduling_and_encoding_parameters_do_not_change_the_key() -> None:
    assert _key(parameters={"priority": 2, "timeout": 100, "binary_data_output": True}) == _key()


def test_bytes_inputs_are_keyed_on_their_elements() -> None:
    one = np.array([b"ab", b"c"], dtype=np.object_)
    other = np.array([b"a", b"bc"], dtype=np.object_)
    assert _key([InputTensor("S", BYTES, (2,), one)]) != _key([InputTensor("S", BYTES, (2,), other)])


def _answer(nbytes: int, value: int = 0) -> list[OutputTensor]:
    data = np.full(nbytes, value, dtype=np.uint8)
    return [OutputTensor("OUT", datatypes.from_name("UINT8"), data.shape, data)]


def test_least_recently_used_entries_are_evicted_to_stay_within_the_size() -> None:
    entry = 100 + ENTRY_OVERHEAD
    cache = ResponseCache(3 * entry)
    for name in (b"a", b"b", b"c"):
        assert cache.insert(name, _answer(100))
    assert len(cache) == 3 and cache.used == 3 * entry and cache.utilization() == 1.0
    assert cache.lookup(b"a") is not None  # now b is the least recently used
    assert cache.insert(b"d", _answer(100))
    assert cache.lookup(b"b") is None
    assert all(cache.lookup(k) is not None for k in (b"a", b"c", b"d"))
    assert cache.insert(b"e", _answer(100 + entry))  # takes two entries' room: a and c go
    assert len(cache) == 2 and cache.used == 3 * entry
    assert cache.lookup(b"a") is None and cache.lookup(b"c") is None
    assert cache.lookup(b"d") is not None and cache.lookup(b"e") is not None


def test_an_answer_larger_than_the_cache_is_not_stored_and_evicts_nothing() -> None:
    cache = ResponseCache(1000)
    assert cache.insert(b"small", _answer(10))
    assert not cache.insert(b"big", _answer(1000))
    assert cache.lookup(b"big") is None
    assert cache.lookup(b"small") is not None and len(cache) == 1


def test_reinserting_a_key_replaces_its_entry() -> None:
    cache = ResponseCache(10_000)
    cache.insert(b"k", _answer(10, 1))
    cache.insert(b"k", _answer(20, 2))
    assert len(cache) == 1 and cache.used == 20 + ENTRY_OVERHEAD
    (hit,) = cache.lookup(b"k") or ()
    assert hit.data.tolist() == [2] * 20


def test_entries_are_copies_in_and_out() -> None:
    cache = ResponseCache(10_000)
    outputs = _answer(8, 7)
    cache.insert(b"k", outputs)
    outputs[0].data[:] = 0  # the model's (or request's) buffer is reused
    (first,) = cache.lookup(b"k") or ()
    assert first.data.tolist() == [7] * 8
    first.data[:] = 1  # a transport writing into what it was given
    (second,) = cache.lookup(b"k") or ()
    assert second.data.tolist() == [7] * 8
    assert not np.shares_memory(first.data, second.data)


@pytest.mark.parametrize(
    "elements, charged", [([b"x" * 50, b"y"], 51 + 2 * 8), (["text", "more"], 8 + 2 * 8)]
)
def test_bytes_answers_are_sized_by_their_elements(elements: list[object], charged: int) -> None:
    data = np.array(elements, dtype=np.object_)
    cache = ResponseCache(10_000)
    assert cache.insert(b"k", [OutputTensor("S", BYTES, (2,), data)])
    assert cache.used == ENTRY_OVERHEAD + charged
