"""The trace extension over HTTP: ``GET /v2[/models/<m>]/trace/setting`` reads the trace
settings (global, or a model's), ``POST`` changes the ones its body names; both answer with
every setting (``server.tracing``)."""

from __future__ import annotations

from server.http.base import BaseHandler
from server.tracing import api


class TraceSettingHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET", "POST")

    async def get(self, model_name: str = "") -> None:
        self.write_json(await self.dataplane.trace_settings(model_name, None))

    async def post(self, model_name: str = "") -> None:
        if model_name:  # an unknown model is reported first, whatever the body (as Triton)
            await self.dataplane.trace_settings(model_name, None)
        changes = api.from_json(self.body_object("trace setting request"))
        self.write_json(await self.dataplane.trace_settings(model_name, changes))
