"""A local OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` bodies decoded as
``ExportTraceServiceRequest`` protobufs, their spans kept, on 127.0.0.1 and a free port."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Any] = []  # opentelemetry.proto.trace.v1.Span
        self.resources: list[dict[str, str]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                receiver._keep(request)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def _keep(self, request: Any) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                self.resources.append({
                    a.key: a.value.string_value for a in resource_spans.resource.attributes
                })
                for scope in resource_spans.scope_spans:
                    self.spans.extend(scope.spans)

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Any]:
        """The spans received, once there are ``count`` (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.spans)} spans received, expected {count}")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
