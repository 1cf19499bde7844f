"""RequestHeaders.get: what HTTPHeaders.get answers, without its exception for absent names."""

from __future__ import annotations

from tornado import httputil

from server.http.headers import RequestHeaders


def test_get_answers_as_tornados_headers_do() -> None:
    ours, tornados = RequestHeaders(), httputil.HTTPHeaders()
    for headers in (ours, tornados):
        headers["Content-Length"] = "12"
        headers.add("X-Many", "a")
        headers.add("x-many", "b")
    for name in ("content-length", "Content-Length", "X-MANY", "Absent"):
        assert ours.get(name) == tornados.get(name), name
        assert ours.get(name, "default") == tornados.get(name, "default"), name
    assert ours.get("x-many") == "a,b"
    assert ours.get("absent") is None and ours.get("absent", "d") == "d"
