"""What the sweep asks the server outside the load, over the protocol being measured: model
metadata and ``max_batch_size`` (to make inputs), one probe request (to fail early and clearly
on a request the server refuses), and the statistics extension before and after each step.

Runs in the main process only, with blocking calls: none of this is timed.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from server.generated import grpc_service_pb2 as pb
from server.loadtest.clients import MAX_GRPC_MESSAGE, MODEL_INFER, HttpFraming, identity
from server.loadtest.encoding import model_path
from server.loadtest.errors import BenchError
from server.loadtest.inputs import ModelInfo, TensorSpec
from server.loadtest.measurements import ServerCounters
from server.protocol.proto_json import message_to_json

_TIMEOUT_S = 30.0
_SERVICE = "/inference.GRPCInferenceService/"

ResponseT = TypeVar("ResponseT", bound=Message)


class ServerApi(Protocol):
    """The calls a sweep makes besides the load itself."""

    def model_info(self, model: str, version: str) -> ModelInfo: ...

    def counters(self, model: str, version: str) -> ServerCounters | None:
        """The model's cumulative statistics; None when the server does not have them."""

    def probe(self, request: bytes) -> bytes:
        """Send one pre-encoded inference request; the raw response (HTTP message or
        serialized ``ModelInferResponse``). Raises BenchError when there is none."""

    def close(self) -> None: ...


def _spec(entry: dict[str, Any]) -> TensorSpec:
    return TensorSpec(
        str(entry["name"]), str(entry["datatype"]), tuple(int(d) for d in entry["shape"])
    )


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:300].decode("utf-8", "replace") or "(empty body)"


class HttpServerApi:
    """The REST endpoints, over one keep-alive connection."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._connection: http.client.HTTPConnection | None = None

    @property
    def where(self) -> str:
        return (
            f"http://{self._host}:{self._port}"
            if ":" not in self._host
            else (f"http://[{self._host}]:{self._port}")
        )

    def _get(self, path: str) -> tuple[int, bytes]:
        for attempt in (1, 2):  # the server may have closed an idle keep-alive connection
            if self._connection is None:
                self._connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=_TIMEOUT_S
                )
            try:
                self._connection.request("GET", path)
                response = self._connection.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2 or isinstance(exc, ConnectionRefusedError | socket.gaierror):
                    raise BenchError(f"cannot reach the server at {self.where}: {exc}") from None
        raise AssertionError("unreachable")

    def model_info(self, model: str, version: str) -> ModelInfo:
        path = model_path(model, version)
        status, body = self._get(path)
        if status != 200:
            raise BenchError(f"model {model!r}: the server answered {status}: {_error_text(body)}")
        try:
            metadata = json.loads(body)
            inputs = tuple(_spec(entry) for entry in metadata["inputs"])
            outputs = tuple(_spec(entry) for entry in metadata.get("outputs", []))
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchError(f"model {model!r}: unreadable metadata ({exc})") from None
        max_batch_size = 0
        status, body = self._get(path + "/config")
        if status == 200:  # servers without the model_configuration extension: no batching
            try:
                max_batch_size = int(json.loads(body).get("max_batch_size", 0))
            except (ValueError, TypeError, AttributeError):
                pass
        return ModelInfo(model, version, inputs, outputs, max_batch_size)

    def counters(self, model: str, version: str) -> ServerCounters | None:
        status, body = self._get(model_path(model, version) + "/stats")
        if status != 200:
            return None
        try:
            return ServerCounters.from_json(json.loads(body))
        except (ValueError, TypeError, AttributeError):
            return None

    def probe(self, request: bytes) -> bytes:
        framing = HttpFraming()
        buffer = bytearray()
        try:
            with socket.create_connection((self._host, self._port), timeout=_TIMEOUT_S) as sock:
                sock.sendall(request)
                length = None
                while length is None or len(buffer) < length:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        raise ConnectionError("the server closed the connection")
                    buffer += chunk
                    if length is None:
                        length = framing.response_length(buffer, len(buffer))
        except OSError as exc:
            raise BenchError(
                f"no response to an inference request from {self.where}: {exc}"
            ) from None
        return bytes(buffer)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class GrpcServerApi:
    """The ``inference.GRPCInferenceService`` RPCs, on one blocking channel."""

    def __init__(self, host: str, port: int) -> None:
        self.where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._channel = grpc.insecure_channel(
            self.where,
            options=[
                ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
                ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
            ],
        )

    def _call(
        self, method: str, request: Message, parse: Callable[[bytes], ResponseT]
    ) -> ResponseT:
        call: grpc.UnaryUnaryMultiCallable[Message, ResponseT] = self._channel.unary_unary(
            _SERVICE + method,
            request_serializer=_serialize,
            response_deserializer=parse,
        )
        response: ResponseT = call(request, timeout=_TIMEOUT_S)
        return response

    def _unreachable(self, exc: grpc.RpcError) -> BenchError:
        return BenchError(f"cannot reach the gRPC server at {self.where}: {_details(exc)}")

    def model_info(self, model: str, version: str) -> ModelInfo:
        try:
            metadata = self._call(
                "ModelMetadata",
                pb.ModelMetadataRequest(name=model, version=version),
                pb.ModelMetadataResponse.FromString,
            )
        except grpc.RpcError as exc:
            if _code(exc) in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise self._unreachable(exc) from None
            raise BenchError(f"model {model!r}: {_details(exc)}") from None
        max_batch_size = 0
        try:
            config = self._call(
                "ModelConfig",
                pb.ModelConfigRequest(name=model, version=version),
                pb.ModelConfigResponse.FromString,
            )
            max_batch_size = config.config.max_batch_size
        except grpc.RpcError:  # servers without ModelConfig: treat the model as not batching
            pass

        def specs(tensors: Any) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in tensors)

        return ModelInfo(
            model, version, specs(metadata.inputs), specs(metadata.outputs), max_batch_size
        )

    def counters(self, model: str, version: str) -> ServerCounters | None:
        try:
            response = self._call(
                "ModelStatistics",
                pb.ModelStatisticsRequest(name=model, version=version),
                pb.ModelStatisticsResponse.FromString,
            )
        except grpc.RpcError as exc:
            if _code(exc) == grpc.StatusCode.UNAVAILABLE:
                raise self._unreachable(exc) from None
            return None
        # The same JSON the HTTP statistics endpoint answers with.
        return ServerCounters.from_json(message_to_json(response))

    def probe(self, request: bytes) -> bytes:
        call = self._channel.unary_unary(
            MODEL_INFER, request_serializer=identity, response_deserializer=identity
        )
        try:
            response: bytes = call(request, timeout=_TIMEOUT_S)
        except grpc.RpcError as exc:
            if _code(exc) == grpc.StatusCode.UNAVAILABLE:
                raise self._unreachable(exc) from None
            raise BenchError(f"the server refused the request: {_details(exc)}") from None
        return response

    def close(self) -> None:
        self._channel.close()


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(exc, "code", None)
    return code() if callable(code) else None


def _details(exc: grpc.RpcError) -> str:
    code, details = _code(exc), getattr(exc, "details", None)
    text = details() if callable(details) else str(exc)
    return f"{code.name if code else 'error'}: {text}"
