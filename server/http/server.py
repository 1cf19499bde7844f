"""The HTTP/REST application: routes as Triton's regexes (triton-facts §1.1)."""

from __future__ import annotations

import tornado.web

from server.http.base import NotFoundHandler
from server.http.infer import InferHandler
from server.http.metadata import (
    LiveHandler,
    ModelConfigHandler,
    ModelMetadataHandler,
    ModelReadyHandler,
    ReadyHandler,
    ServerMetadataHandler,
)
from server.http.repository import (
    RepositoryIndexHandler,
    RepositoryLoadHandler,
    StatisticsHandler,
)
from server.http.shared_memory import SharedMemoryHandler
from server.memory.host_pool import BufferSource
from server.plane import Plane
from server.settings import Settings

_MODEL = r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
_SHARED_MEMORY = (
    r"/v2/(systemsharedmemory|cudasharedmemory)(?:/region/([^/]+))?/(status|register|unregister)"
)


def make_app(dataplane: Plane, settings: Settings, pool: BufferSource) -> tornado.web.Application:
    """Build the Tornado application; unknown paths are 404 and wrong methods 405, as JSON."""
    common = {"dataplane": dataplane, "settings": settings}
    return tornado.web.Application(
        [
            (r"/v2/health/live", LiveHandler, common),
            (r"/v2/health/ready", ReadyHandler, common),
            (r"/v2", ServerMetadataHandler, common),
            (r"/v2/repository(?:/[^/]+)?/index", RepositoryIndexHandler, common),
            (r"/v2/repository(?:/[^/]+)?/models/([^/]+)/(load|unload)", RepositoryLoadHandler, common),
            (r"/v2/models/stats", StatisticsHandler, common),
            (_SHARED_MEMORY, SharedMemoryHandler, common),
            (_MODEL + r"/stats", StatisticsHandler, common),
            (_MODEL + r"/ready", ModelReadyHandler, common),
            (_MODEL + r"/config", ModelConfigHandler, common),
            (_MODEL + r"/infer", InferHandler, {**common, "pool": pool}),
            (_MODEL, ModelMetadataHandler, common),
        ],
        default_handler_class=NotFoundHandler,
        default_handler_args=common,
        compress_response=False,
    )
