"""The system and CUDA shared memory extensions over HTTP (triton-facts §1.2, §1.5).

``GET /v2/{system,cuda}sharedmemory[/region/{r}]/status``,
``POST /v2/{system,cuda}sharedmemory/region/{r}/register`` and
``POST /v2/{system,cuda}sharedmemory[/region/{r}]/unregister`` (no region: all of them).
"""

from __future__ import annotations

from typing import Any

from server.errors import InvalidArgument
from server.http.base import BaseHandler, decode_b64

_KINDS = {"systemsharedmemory": "system", "cudasharedmemory": "cuda"}


class SharedMemoryHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET", "POST")

    async def get(self, extension: str, region: str | None, action: str) -> None:
        if action != "status":
            self.send_error(405)
            return
        self.write_json(await self.dataplane.shm_status(_KINDS[extension], region or ""))

    async def post(self, extension: str, region: str | None, action: str) -> None:
        kind = _KINDS[extension]
        plane = self.dataplane
        if action == "unregister":
            await plane.shm_unregister(kind, region or "")
        elif action == "register":
            if not region:
                raise InvalidArgument("registering a shared memory region needs its name")
            body = self.body_object("shared memory register request")
            if kind == "system":
                await plane.shm_register_system(
                    region,
                    _string(body, "key"),
                    _integer(body, "offset", 0),
                    _integer(body, "byte_size"),
                )
            else:
                await plane.shm_register_cuda(
                    region,
                    _handle(body),
                    _integer(body, "device_id"),
                    _integer(body, "byte_size"),
                )
        else:
            self.send_error(405)
            return
        self.finish()


def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise InvalidArgument(f"Unable to parse '{key}': expected a string")
    return value


def _integer(body: dict[str, Any], key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"Unable to parse '{key}': expected a non-negative integer")
    return value


def _handle(body: dict[str, Any]) -> bytes:
    raw = body.get("raw_handle")
    if not isinstance(raw, dict) or not isinstance(raw.get("b64"), str):
        raise InvalidArgument("Unable to parse 'raw_handle': expected {\"b64\": <base64 string>}")
    return decode_b64(raw["b64"], "raw_handle")
