"""Which restricted-API category each HTTP path is in, as Triton's dispatch sorts them
(``src/http_server.cc``)."""

from __future__ import annotations

import pytest

from server.http.categories import category


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/v2/health/live", "health"),
        ("/v2/health/ready", "health"),
        ("/v2/models/simple/ready", "health"),
        ("/v2/models/simple/versions/1/ready", "health"),
        ("/v2", "metadata"),
        ("/v2/models/simple", "metadata"),
        ("/v2/models/simple/versions/3", "metadata"),
        ("/v2/models/simple/infer", "inference"),
        ("/v2/models/simple/versions/1/infer", "inference"),
        ("/v2/models/simple/generate", "inference"),
        ("/v2/models/simple/generate_stream", "inference"),
        ("/v2/models/simple/config", "model-config"),
        ("/v2/models/simple/versions/1/config", "model-config"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/simple/stats", "statistics"),
        ("/v2/models/simple/versions/1/stats", "statistics"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/myrepo/index", "model-repository"),
        ("/v2/repository/models/simple/load", "model-repository"),
        ("/v2/repository/models/simple/unload", "model-repository"),
        ("/v2/repository/myrepo/models/simple/unload", "model-repository"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
        ("/v2/systemsharedmemory/unregister", "shared-memory"),
        ("/v2/cudasharedmemory/region/r/status", "shared-memory"),
        ("/v2/cudasharedmemory/region/r/unregister", "shared-memory"),
        ("/v2/trace/setting", "trace"),
        ("/v2/models/simple/trace/setting", "trace"),
        ("/v2/logging", "logging"),
    ],
)
def test_route_categories(path: str, expected: str) -> None:
    assert category(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "/metrics",  # its own port, never restricted
        "/",
        "/v2/",
        "/v2/health",
        "/v2/health/alive",
        "/v2/models",
        "/v2/models/simple/unknown",
        "/v2/models/simple/versions/x",
        "/v2/models/simple/versions/1/trace/setting",  # not a Triton route
        "/v2/repository/models/simple/reload",
        "/v2/systemsharedmemory/region/r/open",
        "/v2/logging/more",
        "/v3/models/simple",
    ],
)
def test_other_paths_have_no_category(path: str) -> None:
    assert category(path) is None
