"""The gRPC server's channel arguments: tritonserver's keepalive flags reach grpc core."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from server.grpc import server as grpc_server
from server.grpc.server import GrpcServer, keepalive_options
from server.settings import GrpcKeepalive


def test_default_keepalive_is_tritons() -> None:
    assert dict(keepalive_options(GrpcKeepalive())) == {
        "grpc.keepalive_time_ms": 7_200_000,
        "grpc.keepalive_timeout_ms": 20_000,
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.http2.max_pings_without_data": 2,
        "grpc.http2.min_ping_interval_without_data_ms": 300_000,
        "grpc.http2.max_ping_strikes": 2,
    }


def test_every_keepalive_setting_has_its_channel_argument() -> None:
    options = dict(keepalive_options(GrpcKeepalive(1, 2, True, 3, 4, 5, 6, 7)))
    assert options == {
        "grpc.keepalive_time_ms": 1,
        "grpc.keepalive_timeout_ms": 2,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 3,
        "grpc.http2.min_ping_interval_without_data_ms": 4,
        "grpc.http2.max_ping_strikes": 5,
        "grpc.max_connection_age_ms": 6,
        "grpc.max_connection_age_grace_ms": 7,
    }


def test_the_options_reach_the_grpc_server(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict[str, Any]] = []
    real = grpc.aio.server

    def server(**kwargs: Any) -> grpc.aio.Server:
        built.append(dict(kwargs["options"]))
        return real(**kwargs)

    async def build() -> None:  # as the servers are: on a running loop
        GrpcServer(object(), keepalive=GrpcKeepalive(time_ms=1234, max_connection_age_ms=99))  # type: ignore[arg-type]
        GrpcServer(object(), share_port=True)  # type: ignore[arg-type]

    monkeypatch.setattr(grpc_server.grpc.aio, "server", server)
    asyncio.run(build())
    assert built[0]["grpc.keepalive_time_ms"] == 1234
    assert built[0]["grpc.max_connection_age_ms"] == 99
    assert built[0]["grpc.so_reuseport"] == 0
    assert built[0]["grpc.max_receive_message_length"] == grpc_server.MAX_MESSAGE_SIZE
    assert built[1]["grpc.keepalive_time_ms"] == 7_200_000
    assert "grpc.max_connection_age_ms" not in built[1]
    assert built[1]["grpc.so_reuseport"] == 1
