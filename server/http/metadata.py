"""Health, server and model metadata, model readiness and model configuration routes."""

from __future__ import annotations

from server.http.base import BaseHandler
from server.repository.config import to_json


class _HealthHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    def answer(self, healthy: bool) -> None:
        # Health answers carry no body: 200 when true, 400 when not (as Triton).
        self.clear_header("Content-Type")
        self.set_status(200 if healthy else 400)
        self.finish()


class LiveHandler(_HealthHandler):
    def get(self) -> None:
        self.answer(self.dataplane.live())


class ReadyHandler(_HealthHandler):
    async def get(self) -> None:
        self.answer(await self.dataplane.ready())


class ServerMetadataHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    async def get(self) -> None:
        self.write_json(await self.dataplane.server_metadata())


class ModelReadyHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    async def get(self, model: str, version: str | None) -> None:
        if await self.dataplane.model_ready(model, version or ""):
            self.finish()
            return
        self.set_status(400)
        self.write_json({"error": "Model version not ready"})


class ModelMetadataHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    async def get(self, model: str, version: str | None) -> None:
        self.write_json(await self.dataplane.model_metadata(model, version or ""))


class ModelConfigHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    async def get(self, model: str, version: str | None) -> None:
        self.write_json(to_json(await self.dataplane.model_config(model, version or "")))
