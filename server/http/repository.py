"""The model repository extension (index, load, unload) and the statistics extension."""

from __future__ import annotations

from typing import Any

from server.errors import InvalidArgument
from server.http.base import BaseHandler, decode_b64
from server.observability.statistics import statistics_json
from server.repository.overrides import FILE_PREFIX


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidArgument("Unable to parse 'parameters': expected an object")
    return params


class RepositoryIndexHandler(BaseHandler):
    SUPPORTED_METHODS = ("POST",)

    async def post(self) -> None:
        ready = self.body_object("repository index request").get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidArgument("Invalid value for 'ready': expected a boolean")
        self.write_json(await self.dataplane.repository_index(ready))


class RepositoryLoadHandler(BaseHandler):
    SUPPORTED_METHODS = ("POST",)

    async def post(self, model: str, action: str) -> None:
        params = _parameters(self.body_object(f"model {action} request"))
        if action == "unload":
            dependents = params.get("unload_dependents", False)
            if not isinstance(dependents, bool):
                raise InvalidArgument("Unable to parse 'unload_dependents': expected a boolean")
            await self.dataplane.unload_model(model, dependents)
        else:
            config = params.get("config")
            if config is not None and not isinstance(config, str):
                raise InvalidArgument("Unable to parse 'config': expected a JSON string")
            await self.dataplane.load_model(model, config, _files(params))
        self.finish()


def _files(params: dict[str, Any]) -> dict[str, bytes]:
    files = {}
    for key, value in params.items():
        if not key.startswith(FILE_PREFIX):
            continue
        if not isinstance(value, str):
            raise InvalidArgument(f"Unable to parse '{key[:200]}': expected base64 text")
        files[key] = decode_b64(value, key[:200])
    return files


class StatisticsHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    async def get(self, model: str | None = None, version: str | None = None) -> None:
        response = await self.dataplane.statistics(model or "", version or "")
        self.write_json(statistics_json(response))
