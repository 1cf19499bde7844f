"""The metrics endpoint: ``GET /metrics`` on its own port, as Triton serves it (8002).

A separate Tornado application on the same event loop: the page is rendered where the model
counters live, and a scrape never queues behind inference traffic's connection limits. Other
methods get 405 and other paths 404, from Tornado.
"""

from __future__ import annotations

from collections.abc import Callable

import tornado.web

from server.observability.metrics import CONTENT_TYPE


class MetricsHandler(tornado.web.RequestHandler):
    """Renders the Prometheus text page on every GET."""

    def initialize(self, page: Callable[[], str]) -> None:
        self._page = page

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self._page())


def make_metrics_app(page: Callable[[], str]) -> tornado.web.Application:
    return tornado.web.Application([(r"/metrics", MetricsHandler, {"page": page})])
