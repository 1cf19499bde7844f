"""RequestHeaders: what Tornado's HTTPHeaders answers for the same fields."""

from __future__ import annotations

from tornado import httputil

from server.http.headers import RequestHeaders

_FIELDS = [
    (b"Host", b"localhost:8000"),
    (b"Content-Length", b"12"),
    (b"X-Many", b"a"),
    (b"x-many", b"b"),
    (b"Accept", b"\xe9t\xe9"),  # obs-text: latin-1, as Tornado reads it
]


def _tornados() -> httputil.HTTPHeaders:
    headers = httputil.HTTPHeaders()
    for name, value in _FIELDS:
        headers.add(name.decode("latin1"), value.decode("latin1"))
    return headers


def test_get_answers_as_tornados_headers_do() -> None:
    ours, tornados = RequestHeaders(_FIELDS), _tornados()
    for name in ("content-length", "Content-Length", "X-MANY", "accept", "Absent"):
        assert ours.get(name) == tornados.get(name), name
        assert ours.get(name, "default") == tornados.get(name, "default"), name
    assert ours.get("x-many") == "a,b"
    assert ours.get("absent") is None and ours.get("absent", "d") == "d"


def test_contains_is_case_blind() -> None:
    ours = RequestHeaders(_FIELDS)
    for name in ("Content-Length", "content-length", "X-MANY", "Transfer-Encoding"):
        assert (name in ours) == (name in _tornados()), name


def test_tornados_headers_keep_every_line() -> None:
    built = RequestHeaders(_FIELDS).tornado()
    assert sorted(built.get_all()) == sorted(_tornados().get_all())
    assert built.get_list("X-Many") == ["a", "b"]


def test_tornados_headers_are_built_once() -> None:
    headers = RequestHeaders(_FIELDS)
    assert headers.tornado() is headers.tornado()


def test_no_fields() -> None:
    headers = RequestHeaders()
    assert headers.get("Host") is None and "Host" not in headers
    assert list(headers.tornado().get_all()) == []


def test_values_lose_the_spaces_around_them_and_may_be_empty() -> None:
    fields = [(b"Connection", b"close \t"), (b"X-Empty", b""), (b"X-Two", b""), (b"X-Two", b"a ")]
    ours = RequestHeaders(fields)
    assert ours.get("connection") == "close"
    assert ours.get("X-Empty") == "" and "x-empty" in ours
    assert ours.get("x-two") == ",a"
    built = ours.tornado()  # (Tornado refuses a repeated value with a trailing space)
    assert built.get_list("X-Two") == ["", "a"] and built["Connection"] == "close"
