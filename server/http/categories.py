"""Which restricted-API category an HTTP path is in, as Triton's HTTP dispatch sorts them
(``src/http_server.cc``), including routes this server does not serve yet (trace,
generate): those are refused like Triton's when restricted, else answered 404."""

from __future__ import annotations

import re

from server import restricted

_MODEL = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_MODEL_KINDS = {
    "infer": restricted.INFERENCE,
    "generate": restricted.INFERENCE,
    "generate_stream": restricted.INFERENCE,
    "ready": restricted.HEALTH,
    "config": restricted.MODEL_CONFIG,
    "stats": restricted.STATISTICS,
    "": restricted.METADATA,
}
_EXACT = {
    "/v2/models/stats": restricted.STATISTICS,
    "/v2/logging": restricted.LOGGING,
    "/v2": restricted.METADATA,
    "/v2/health/live": restricted.HEALTH,
    "/v2/health/ready": restricted.HEALTH,
    "/v2/trace/setting": restricted.TRACE,
}
_OTHERS = (
    (
        re.compile(
            r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:status|register|unregister)"
        ),
        restricted.SHARED_MEMORY,
    ),
    (
        re.compile(r"/v2/repository(?:/[^/]+)?/(?:index|models/[^/]+/(?:load|unload))"),
        restricted.MODEL_REPOSITORY,
    ),
)


def category(path: str) -> str | None:
    """The category of a request for ``path`` (without the query), None when none is."""
    exact = _EXACT.get(path)
    if exact is not None:
        return exact
    model = _MODEL.fullmatch(path)
    if model is not None:
        version, kind = model.group(2), model.group(3) or ""
        if kind == "trace/setting":
            return restricted.TRACE if version is None else None  # not a Triton route
        return _MODEL_KINDS[kind]
    for pattern, name in _OTHERS:
        if pattern.fullmatch(path):
            return name
    return None
