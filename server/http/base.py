"""Shared handler behaviour: every non-200 answer is ``{"error": "<message>"}`` JSON, with the
status taken from the error hierarchy's one table."""

from __future__ import annotations

import base64
import binascii
import logging
from types import TracebackType
from typing import Any

import orjson
import tornado.web

from server.errors import InferenceServerError, InternalError, InvalidArgument
from server.plane import Plane
from server.protocol.rest_codec import parse_json
from server.settings import Settings

log = logging.getLogger("server.http")

ExcInfo = tuple[type[BaseException], BaseException, TracebackType]


class BaseHandler(tornado.web.RequestHandler):
    """Gives handlers the data plane and settings, and writes errors as Triton does."""

    dataplane: Plane
    settings_: Settings

    def initialize(self, dataplane: Plane, settings: Settings, **_: Any) -> None:
        self.dataplane = dataplane
        self.settings_ = settings

    def set_default_headers(self) -> None:
        self.clear_header("Server")

    def compute_etag(self) -> None:
        return None  # V2 answers are not cacheable resources

    def body_object(self, what: str) -> dict[str, Any]:
        """The request body as a JSON object (an empty body is an empty object); 400 else."""
        if not self.request.body.strip():
            return {}
        body = parse_json(self.request.body, what)
        if not isinstance(body, dict):
            raise InvalidArgument(f"the {what} must be a JSON object")
        return body

    def write_json(self, body: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info: ExcInfo | None = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        if isinstance(error, InferenceServerError):
            self.set_status(error.http_status)
            message = error.message
        elif isinstance(error, tornado.web.HTTPError) and error.log_message and status_code < 500:
            message = error.log_message % error.args if error.args else error.log_message
        else:
            message = self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(orjson.dumps({"error": message}))

    def log_exception(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(value, InferenceServerError) and not isinstance(value, InternalError):
            return  # a client's mistake, answered with 4xx: not a server fault
        if isinstance(value, tornado.web.HTTPError) and value.status_code < 500:
            return
        log.error(
            "internal error on %s %s", self.request.method, self.request.uri,
            exc_info=(typ, value, tb) if typ and value else None,
        )


class NotFoundHandler(BaseHandler):
    """Every path no route matches: 404 ``{"error": "Not Found"}``, whatever the method."""

    def prepare(self) -> None:
        self.set_status(404)
        self.write_json({"error": "Not Found"})


class RefusedHandler(BaseHandler):
    """A request answered with one error before its route and method are looked at (a
    restricted API without its header); its body is read first, the connection stays open."""

    def initialize(  # type: ignore[override]
        self, dataplane: Plane, settings: Settings, error: InferenceServerError
    ) -> None:
        super().initialize(dataplane, settings)
        self._error = error

    def prepare(self) -> None:
        raise self._error


def decode_b64(text: str, key: str) -> bytes:
    """Base64 ``text`` from field ``key`` of a request body, as bytes; 400 when malformed."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"Unable to parse '{key}': invalid base64") from None
