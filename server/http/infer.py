"""``POST /v2/models/{m}[/versions/{v}]/infer``: streamed body in, JSON + binary out.

``prepare`` sizes a pooled buffer from the headers (refusing oversize bodies before reading
them), ``data_received`` copies each chunk into it, ``post`` decodes, runs and writes the
response. Binary outputs are written as memoryviews after the JSON header, never joined.
"""

from __future__ import annotations

import asyncio
from typing import Any

import tornado.iostream
import tornado.web

from server.errors import InferenceServerError, Unsupported, reported
from server.http import body as http_body
from server.http.base import BaseHandler, log
from server.memory.host_pool import BufferSource
from server.protocol import binary, rest_codec
from server.protocol.model_spec import ModelSpec
from server.protocol.types import InferRequest
from server.threads import off_loop_if_large, run_in_thread

_SMALL_RESPONSE = 1 << 16  # below this, header and blobs go out in one write
_DRAIN_BYTES = 64 << 20  # an oversize body up to this much over the limit is read and dropped


@tornado.web.stream_request_body
class InferHandler(BaseHandler):
    SUPPORTED_METHODS = ("POST",)

    pool: BufferSource

    def initialize(self, pool: BufferSource, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.pool = pool
        self._receiver: http_body.BodyReceiver | None = None
        self._in_post = False
        self._request_id: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._drained_refusal = False

    def prepare(self) -> None:
        headers = self.request.headers
        limit = self.settings_.http_max_input_size
        length: int | None = None
        try:
            length = http_body.parse_content_length(headers.get("Content-Length"))
            self._encoding = http_body.parse_content_encoding(headers.get("Content-Encoding"))
            if length is not None and length > limit:
                is_binary = headers.get("Inference-Header-Content-Length") is not None
                raise http_body.too_large(length, limit, binary=is_binary)
            # A compressed body is charged what it may inflate to.
            self._admit(limit if self._encoding else self.pool.footprint(length))
        except InferenceServerError as exc:
            # An unknown Content-Encoding is answered with the encodings we take (as Triton).
            extra = {"Accept-Encoding": "gzip, deflate"} if isinstance(exc, Unsupported) else None
            # A client waiting for "100 Continue" gets the final answer instead, and the
            # connection is closed (it may never send the body).
            waiting = headers.get("Expect", "").lower() == "100-continue"
            if length is not None and length <= limit + _DRAIN_BYTES and not waiting:
                self._answer_then_drain(exc, extra, length)
            else:
                self.send_server_error(exc, extra)
            return
        self._receiver = http_body.BodyReceiver(
            self.pool, limit, length, self.settings_.http_max_inflight_bytes
        )

    def _admit(self, nbytes: int) -> None:
        """Admission control: the bodies being received and the requests holding them may
        use at most ``--http-max-inflight-bytes``, so many slow uploaders cannot exhaust
        memory; past it a request is answered 503 before its body is stored."""
        http_body.admit(self.pool, nbytes, self.settings_.http_max_inflight_bytes)

    def _answer_then_drain(
        self, error: InferenceServerError, headers: dict[str, str] | None, length: int
    ) -> None:
        """Send the refusal now, then read and drop the body: a client still sending it gets
        the answer instead of a connection reset, and the connection stays usable."""
        self._drained_refusal = True
        self.request.connection.set_max_body_size(length)  # type: ignore[union-attr]
        self.send_server_error(error, headers, finish=False)
    def data_received(self, chunk: bytes) -> None:
        if self._receiver is None:
            return
        try:
            self._receiver.feed(chunk)
        except InferenceServerError as exc:
            # Answer now: Tornado closes the connection once the answer is written, which is
            # the only way to stop reading the rest of an oversize body.
            self._release()
            self.send_server_error(exc)

    async def post(self, model: str, version: str | None) -> None:
        self._in_post = True
        if self._drained_refusal:  # answered in prepare(); the body has now been dropped
            self.finish()
            return
        if self._receiver is None or self._finished:
            return  # the client went away after sending its body, or it was refused meanwhile
        try:
            with self.dataplane.gate.admit():
                self._task = asyncio.ensure_future(self._infer(model, version or ""))
                await self._task
        except asyncio.CancelledError:
            pass  # the client disconnected: nobody to answer
        except Exception as exc:  # noqa: BLE001 - every failure becomes one {"error": ...}
            where = f"for request id {self._request_id!r} to model '{model}'"
            self.send_server_error(reported(exc, log, where))
        finally:
            self._release()

    async def _infer(self, model: str, version: str) -> None:
        assert self._receiver is not None
        body = self._receiver.body()
        if self._encoding is not None:
            # zlib releases the GIL: inflate off the event loop.
            inflated = await run_in_thread(
                None, http_body.decompress, body, self._encoding, self.settings_.http_max_input_size
            )
            body = memoryview(inflated)
        header_length = binary.parse_header_length(
            self.request.headers.get("Inference-Header-Content-Length"), len(body)
        )
        # Resolve the model first, on the loop (where models are loaded and unloaded): an
        # unknown model or version is reported as such, whatever else is wrong with the body.
        spec = await self.dataplane.model_spec(model, version)
        request = await off_loop_if_large(
            len(body), _decode, body, header_length, model, version, spec,
            self.settings_.http_max_input_size,
        )
        self._request_id = request.id
        response = await self.dataplane.infer(request)
        try:
            encoded = await off_loop_if_large(
                response.payload_bytes, rest_codec.encode_response, response, request
            )
            await self._write_response(encoded)
        finally:
            response.release()

    async def _write_response(self, encoded: rest_codec.EncodedResponse) -> None:
        if encoded.binary:
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Inference-Header-Content-Length", str(len(encoded.header)))
        else:
            self.set_header("Content-Type", "application/json")
        parts: list[memoryview | bytes] = [encoded.header, *encoded.blobs]
        compression = http_body.choose_response_encoding(self.request.headers.get("Accept-Encoding"))
        if compression is not None:
            self.set_header("Content-Encoding", compression)
            # zlib releases the GIL: deflate off the event loop.
            # run_in_thread: the parts may view the request buffer, released once this returns.
            self.finish(await run_in_thread(None, http_body.compress, parts, compression))
            return
        if encoded.size <= _SMALL_RESPONSE:
            self.finish(b"".join(parts))
            return
        self.set_header("Content-Length", str(encoded.size))
        self.write(encoded.header)
        await self.flush()
        connection = self.request.connection
        assert connection is not None
        for blob in encoded.blobs:
            # The blob must stay unchanged until the write completes: hence the await.
            await connection.write(blob)  # type: ignore[arg-type]
        self.finish()

    def on_connection_close(self) -> None:
        """The client went away: drop its request (a queued one never runs). The buffer is
        released by ``post`` once nothing uses it any more."""
        if self._task is not None:
            self._task.cancel()
        elif not self._in_post:
            self._release()
        # Tornado waits for the rest of a streamed body forever once its connection is gone
        # (a body timeout, a client that vanished mid-upload): end that wait, so the handler
        # does not linger until shutdown. Tornado's _execute returns quietly on this error.
        body = getattr(self.request, "_body_future", None)
        if body is not None and not body.done():
            body.set_exception(tornado.iostream.StreamClosedError())
            body.exception()  # retrieved: nobody may be waiting for it (answered in prepare)

    def _release(self) -> None:
        if self._receiver is not None:
            self._receiver.release()
            self._receiver = None


def _decode(
    body: memoryview,
    header_length: int | None,
    model: str,
    version: str,
    spec: ModelSpec,
    max_data_bytes: int,
) -> InferRequest:
    """The request in ``body``: raw binary (a header length of 0), or a JSON header and the
    binary tensors after it (whose JSON data may decode to at most ``max_data_bytes``)."""
    if header_length == 0:
        return rest_codec.decode_raw_request(body, spec, version)
    split = len(body) if header_length is None else header_length
    header = rest_codec.parse_json(body[:split], "inference request")
    return rest_codec.decode_request(header, body[split:], model, version, spec, max_data_bytes)
