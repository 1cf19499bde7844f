"""The logging extension over HTTP: ``GET /v2/logging`` reads the log settings, ``POST``
changes the ones its body names; both answer with every setting (triton-facts §1.5)."""

from __future__ import annotations

from server import log_settings
from server.http.base import BaseHandler


class LoggingHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET", "POST")

    async def get(self) -> None:
        self.write_json(await self.dataplane.log_settings({}))

    async def post(self) -> None:
        changes = log_settings.from_json(self.body_object("log setting request"))
        self.write_json(await self.dataplane.log_settings(changes))
