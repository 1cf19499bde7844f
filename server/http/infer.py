"""``POST /v2/models/{m}[/versions/{v}]/infer``: streamed body in, JSON + binary out.

Served by a request delegate of its own (``server.http.delegates``), below ``tornado.web``
(on the connections of ``server.http.connection``): a ``RequestHandler`` costs about 100 µs
of CPU per request (its Task, header dict, ``prepare`` future, routing, transforms,
``flush``), half as much as everything else about a small request. The answers are
the ones a handler would write: the same status lines, headers, ``{"error": ...}`` bodies and
access log lines; every other route (and every other method on this one) is left to the
Tornado application (``server.http.server``).

``headers_received`` sizes a pooled buffer from the headers (refusing oversize bodies before
reading them), ``data_received`` copies each chunk into it, ``finish`` starts what decodes,
runs and writes the response: a task in one process, at once in a front end (``finish`` says
why). Binary outputs are written as memoryviews after the JSON header, never joined.
"""

from __future__ import annotations

import asyncio
import re
import time
from http.client import responses
from urllib.parse import unquote_to_bytes

import orjson
from tornado import httputil
from tornado.log import access_log

from server import compression, eager
from server.errors import InferenceServerError, InvalidArgument, Unsupported, reported
from server.http import body as http_body
from server.http.base import log
from server.http.exchange import Exchange
from server.http.headers import RequestHeaders
from server.memory.host_pool import BufferSource
from server.plane import Plane
from server.protocol import binary, rest_codec
from server.protocol.header_cache import HeaderCache, decode_rest
from server.protocol.model_spec import ModelSpec
from server.protocol.types import InferRequest
from server.settings import Settings
from server.threads import OFF_LOOP_BYTES, off_loop_if_large, run_in_thread
from server.tracing.context import TraceContext

#: A model's routes, and its infer route as Tornado matches it: against the path before any
#: ``?``, still percent-encoded.
MODEL_PATH = r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
INFER_PATH = re.compile(MODEL_PATH + "/infer$")

_SMALL_RESPONSE = 1 << 16  # below this, header and blobs go out in one write
_DRAIN_BYTES = 64 << 20  # an oversize body up to this much over the limit is read and dropped
_OK = httputil.ResponseStartLine("HTTP/1.1", 200, "OK")
_NO_HEADERS = RequestHeaders()


#: Triton's answer to an HTTP inference request for a decoupled model (UNSUPPORTED).
DECOUPLED_REFUSED = "HTTP end point doesn't support models with decoupled transaction policy"

class InferService:
    """What every infer request needs, shared by all of them."""

    def __init__(self, dataplane: Plane, settings: Settings, pool: BufferSource) -> None:
        self.dataplane = dataplane
        self.pool = pool
        self.max_input_size = settings.http_max_input_size
        self.max_inflight_bytes = settings.http_max_inflight_bytes
        self.headers = HeaderCache()
        self._date_second = -1
        self._date = ""

    def date(self) -> str:
        """The ``Date`` header's value: formatted once a second, not once a request."""
        now = time.time()
        second = int(now)
        if second != self._date_second:
            self._date_second = second
            self._date = httputil.format_timestamp(now)
        return self._date


class InferExchange:
    """One infer request on one connection, from its headers to the end of its answer."""

    def __init__(
        self,
        service: InferService,
        connection: Exchange,
        path: re.Match[str],
        refusal: InferenceServerError | None = None,
    ) -> None:
        """``refusal``: the request is answered with this error whatever it holds (a
        restricted API without its header), its body read and dropped."""
        self._service = service
        self._connection = connection
        self._path = path
        self._refusal = refusal
        self._start = time.time()
        self._received = (time.perf_counter_ns(), 0)  # for a trace: headers in, body in
        self._request_line: httputil.RequestStartLine | None = None
        self._headers = _NO_HEADERS  # until headers_received
        self._encoding: str | None = None
        self._receiver: http_body.BodyReceiver | None = None
        self._task: asyncio.Task[None] | None = None
        self._drained_refusal = False
        self._headers_written = False
        self._finished = False
        self._model = ""
        self._version = ""
        self._request_id: str | None = None
        self._status = 200

    # --- receiving ------------------------------------------------------------------------

    def headers_received(
        self, start_line: httputil.RequestStartLine, headers: RequestHeaders
    ) -> None:
        self._request_line = start_line
        self._headers = headers
        # Told when the client goes away while its answer is being made.
        self._connection.set_close_callback(self.on_connection_close)
        try:
            self._prepare(headers)
        except Exception as exc:  # noqa: BLE001 - a fault here is answered like any other
            self._send_error(reported(exc, log, f"on POST {start_line.path}"))

    def _prepare(self, headers: RequestHeaders) -> None:
        limit = self._service.max_input_size
        length: int | None = None
        try:
            length = http_body.parse_content_length(headers.get("Content-Length"))
            if self._refusal is not None:
                raise self._refusal
            model, version = self._path.groups()
            self._model = _path_argument(model)
            self._version = version or ""  # digits only
            self._encoding = http_body.parse_content_encoding(headers.get("Content-Encoding"))
            if length is not None and length > limit:
                is_binary = headers.get("Inference-Header-Content-Length") is not None
                raise http_body.too_large(length, limit, binary=is_binary)
            # Admission control: the bodies being received and the requests holding them may
            # use at most --http-max-inflight-bytes, so many slow uploaders cannot exhaust
            # memory; past it a request is answered 503 before its body is stored. A
            # compressed body is charged what it may inflate to.
            pool = self._service.pool
            charge = limit if self._encoding else pool.footprint(length)
            http_body.admit(pool, charge, self._service.max_inflight_bytes)
        except InferenceServerError as exc:
            # An unknown Content-Encoding is answered with the encodings we take (as Triton).
            extra = {"Accept-Encoding": "gzip, deflate"} if isinstance(exc, Unsupported) else None
            # A client waiting for "100 Continue" gets the final answer instead, and the
            # connection is closed (it may never send the body).
            waiting = headers.get("Expect", "").lower() == "100-continue"
            if length is not None and length <= limit + _DRAIN_BYTES and not waiting:
                # Answer now, then read and drop the body: a client still sending it gets
                # the answer instead of a connection reset, and the connection stays usable.
                self._drained_refusal = True
                self._connection.set_max_body_size(length)
                self._send_error(exc, extra, finish=False)
            else:
                self._send_error(exc, extra)
            return
        self._receiver = http_body.BodyReceiver(
            self._service.pool, limit, length, self._service.max_inflight_bytes
        )
        if length is not None:  # the rest of a large body is read straight into the buffer
            self._connection.receive_into(self._receiver)

    def data_received(self, chunk: bytes) -> None:
        if self._receiver is None:
            return
        try:
            self._receiver.feed(chunk)
        except InferenceServerError as exc:
            # Answer now: Tornado closes the connection once the answer is written, which is
            # the only way to stop reading the rest of an oversize body.
            self._release()
            self._send_error(exc)

    def finish(self) -> None:
        """The whole body is in: serve it (Tornado calls this only while unanswered)."""
        self._received = (self._received[0], time.perf_counter_ns())
        if self._drained_refusal:  # answered in headers_received; the body has been dropped
            self._end()
        elif self._receiver is not None:
            if self._service.dataplane.remote:
                # A front end: the request leaves for the executor now, within this read
                # (it then waits for the answer, in a task). In one process the task runs
                # it after the loop's other reads, and the answers of one pass go out
                # together: started here, each answer woke the client on its own, and one
                # process served 15% fewer requests at 25 µs more CPU each.
                task = eager.start(self._serve(), self._connection.loop)
            else:
                task = self._connection.loop.create_task(self._serve())
            if task is None:  # answered within this step (a refused request)
                self._release()
                return
            self._task = task
            # When the task is done, whether it ran or was cancelled before it started: only
            # then does nothing use the body (threads it waited for are done too).
            task.add_done_callback(lambda _: self._release())

    def on_connection_close(self) -> None:
        """The client went away: drop its request (a queued one never runs). The buffer is
        released once the task is done, or here if there is none."""
        if self._task is None:
            self._release()
        else:
            self._task.cancel()

    def _release(self) -> None:
        if self._receiver is not None:
            self._connection.receive_into(None)
            self._receiver.release()
            self._receiver = None

    # --- serving --------------------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            with self._service.dataplane.gate.admit():
                await self._infer()
        except asyncio.CancelledError:
            pass  # the client disconnected: nobody to answer
        except Exception as exc:  # noqa: BLE001 - every failure becomes one {"error": ...}
            where = f"for request id {self._request_id!r} to model '{self._model}'"
            self._send_error(reported(exc, log, where))

    async def _infer(self) -> None:
        assert self._receiver is not None
        service = self._service
        body = self._receiver.body()
        if self._encoding is not None:
            # zlib releases the GIL: inflate off the event loop.
            inflated = await run_in_thread(
                http_body.decompress, body, self._encoding, service.max_input_size
            )
            body = memoryview(inflated)
        header_length = binary.parse_header_length(
            self._headers.get("Inference-Header-Content-Length"), len(body)
        )
        # Resolve the model first, on the loop (where models are loaded and unloaded): an
        # unknown model or version is reported as such, whatever else is wrong with the body.
        model, version = self._model, self._version
        spec = await service.dataplane.model_spec(model, version)
        if spec.decoupled:  # Triton's refusal (http_server.cc): decoupled models need gRPC streams
            raise Unsupported(DECOUPLED_REFUSED)
        request = await off_loop_if_large(
            _decoding_cost(len(body), header_length, spec), _decode, service.headers, body,
            header_length, model, version, spec, service.max_input_size,
        )
        self._request_id = request.id
        request.trace = TraceContext("HTTP", *self._received, self._headers.get("traceparent", ""))
        response = await service.dataplane.infer(request)
        try:
            cost = response.payload_bytes
            if cost > OFF_LOOP_BYTES:  # (binary outputs are written from where they lie)
                cost = rest_codec.encoding_cost(response, request)
            encoded = await off_loop_if_large(cost, rest_codec.encode_response, response, request)
            await self._write_response(encoded)
        finally:
            response.release()

    async def _write_response(self, encoded: rest_codec.EncodedResponse) -> None:
        if encoded.binary:
            fields = self._response_fields("application/octet-stream")
            fields.append(("Inference-Header-Content-Length", str(len(encoded.header))))
        else:
            fields = self._response_fields("application/json")
        parts: list[memoryview | bytes] = [encoded.header, *encoded.blobs]
        encoding = http_body.choose_response_encoding(self._headers.get("Accept-Encoding"))
        if encoding is not None:
            fields.append(("Content-Encoding", encoding))
            # zlib releases the GIL: deflate off the event loop.
            # run_in_thread: the parts may view the request buffer, released once this returns.
            compressed = await run_in_thread(compression.compress, parts, encoding)
            self._answer(200, "OK", fields, compressed)
            return
        if encoded.size <= _SMALL_RESPONSE:
            self._answer(200, "OK", fields, b"".join(parts))
            return
        fields.append(("Content-Length", str(encoded.size)))
        self._headers_written = True
        connection = self._connection
        await connection.write_headers(_OK, httputil.HTTPHeaders(dict(fields)), encoded.header)
        for blob in encoded.blobs:
            # The blob must stay unchanged until the write completes: hence the await.
            await connection.write(blob)
        self._end()

    # --- answering ------------------------------------------------------------------------

    def _response_fields(self, content_type: str) -> list[tuple[str, str]]:
        """The headers every answer starts with, in the order Tornado's handlers send them."""
        return [("Content-Type", content_type), ("Date", self._service.date())]

    def _answer(
        self,
        code: int,
        reason: str,
        fields: list[tuple[str, str]],
        body: bytes,
        finish: bool = True,
    ) -> None:
        """Write a whole answer; ``finish=False`` leaves the request open (its body is still
        to be read)."""
        self._status = code
        self._headers_written = True
        self._connection.write_answer(code, reason, fields, body)
        if finish:
            self._end()

    def _send_error(
        self,
        error: InferenceServerError,
        extra: dict[str, str] | None = None,
        finish: bool = True,
    ) -> None:
        """Answer with ``error``'s status and ``{"error": message}`` (when nothing has been
        sent yet)."""
        if self._finished:
            return
        if self._headers_written:
            # Too late for a status: end the connection so the client sees a broken response.
            self._connection.close()
            return
        fields = self._response_fields("application/json")
        fields.extend((extra or {}).items())
        status = error.http_status
        body = orjson.dumps({"error": error.message})
        self._answer(status, responses.get(status, "Unknown"), fields, body, finish)

    def _end(self) -> None:
        self._finished = True
        self._connection.finish()
        self._log_access()

    def _log_access(self) -> None:
        """Tornado's access log line for the answer: "<status> POST <uri> (<ip>) <ms>ms"."""
        status = self._status
        level = 20 if status < 400 else 30 if status < 500 else 40  # INFO, WARNING, ERROR
        if not access_log.isEnabledFor(level):
            return
        assert self._request_line is not None
        remote_ip = getattr(self._connection.context, "remote_ip", "")
        access_log.log(
            level,
            "%d %s %.2fms",
            status,
            f"POST {self._request_line.path} ({remote_ip})",
            1000.0 * (time.time() - self._start),
        )


def _path_argument(text: str) -> str:
    """A part of the path as Tornado hands it to a handler: percent-decoded UTF-8."""
    value = unquote_to_bytes(text)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"Invalid unicode in url: {value[:40]!r}") from None


def _decoding_cost(body_size: int, header_length: int | None, spec: ModelSpec) -> int:
    """The bytes decoding reads one by one: a JSON body whole; of a binary one its JSON
    header, unless the model has an input whose binary data is parsed or checked element by
    element (BYTES, BOOL). Other binary tensors are views of the body, whatever their size.
    (Only a large body is looked into: the answer decides nothing for a small one.)"""
    if header_length is None or body_size <= OFF_LOOP_BYTES:
        return body_size
    if any(t.datatype.is_bytes or t.datatype.name == "BOOL" for t in spec.inputs.values()):
        return body_size
    return header_length


def _decode(
    headers: HeaderCache,
    body: memoryview,
    header_length: int | None,
    model: str,
    version: str,
    spec: ModelSpec,
    max_data_bytes: int,
) -> InferRequest:
    """The request in ``body``: raw binary (a header length of 0), or a JSON header and the
    binary tensors after it (whose JSON data may decode to at most ``max_data_bytes``; a
    header seen before is not decoded again, see ``HeaderCache``)."""
    if header_length == 0:
        return rest_codec.decode_raw_request(body, spec, version)
    if header_length is not None:
        return decode_rest(
            headers, body[:header_length], body[header_length:], model, version, spec,
            max_data_bytes,
        )
    header = rest_codec.parse_json(body, "inference request")  # all JSON: no binary part
    return rest_codec.decode_request(header, body[:0], model, version, spec, max_data_bytes)
