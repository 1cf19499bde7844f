"""Health, server and model metadata, model readiness and model configuration routes."""

from __future__ import annotations

from server.http.base import BaseHandler
from server.repository.config import to_json


class LiveHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    def get(self) -> None:
        # Health answers carry no body: 200 when true, 400 when not (as Triton).
        self.set_status(200 if self.dataplane.live() else 400)
        self.finish()


class ReadyHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    def get(self) -> None:
        self.set_status(200 if self.dataplane.ready() else 400)
        self.finish()


class ServerMetadataHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    def get(self) -> None:
        self.write_json(self.dataplane.server_metadata())


class ModelReadyHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    def get(self, model: str, version: str | None) -> None:
        if self.dataplane.model_ready(model, version or ""):
            self.finish()
            return
        self.set_status(400)
        self.write_json({"error": "Model version not ready"})


class ModelMetadataHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    def get(self, model: str, version: str | None) -> None:
        self.write_json(self.dataplane.model_metadata(model, version or ""))


class ModelConfigHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    def get(self, model: str, version: str | None) -> None:
        self.write_json(to_json(self.dataplane.model_config(model, version or "")))
