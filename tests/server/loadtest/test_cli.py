"""The command line: perf_analyzer's concurrency forms, URLs, and errors as one line with the
right exit status (2 for flags, 1 for the server), never a traceback."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from server.loadtest.cli import (
    main,
    parse_concurrency_list,
    parse_concurrency_range,
    parse_url,
)
from server.loadtest.errors import UsageError


def test_concurrency_range() -> None:
    assert parse_concurrency_range("1:4") == (1, 2, 3, 4)
    assert parse_concurrency_range("2:10:4") == (2, 6, 10)
    assert parse_concurrency_range("1:8:3") == (1, 4, 7)  # additive; END itself only if reached
    assert parse_concurrency_range("5") == (5,)
    for bad in ("", "0:4", "4:1", "1:4:0", "a:b", "1:2:3:4", "-1:3"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_concurrency_range(bad)


def test_concurrency_list() -> None:
    assert parse_concurrency_list("1,2,4,8") == (1, 2, 4, 8)
    assert parse_concurrency_list("16,1") == (16, 1)
    for bad in ("", "1,,2", "0", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_concurrency_list(bad)


def test_url() -> None:
    assert parse_url("localhost:9000", "http") == ("localhost", 9000)
    assert parse_url("http://10.0.0.1:8000/", "http") == ("10.0.0.1", 8000)
    assert parse_url("127.0.0.1", "http") == ("127.0.0.1", 8000)
    assert parse_url("127.0.0.1", "grpc") == ("127.0.0.1", 8001)
    assert parse_url("[::1]:9001", "grpc") == ("::1", 9001)
    for bad in ("host:port", ":80", "host:0", "host:70000"):
        with pytest.raises(UsageError):
            parse_url(bad, "http")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["-m", "simple", "--concurrency-range", "4:1"])
    assert exited.value.code == 2
    assert main(["-m", "simple", "-i", "grpc", "--json"]) == 2
    assert "--json applies to HTTP only" in capsys.readouterr().err
    assert main(["-m", "simple", "--csv", str(tmp_path / "absent" / "x.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unreachable_server_exits_1(protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    port = _closed_port()
    assert main(["-m", "simple", "-i", protocol, "-u", f"127.0.0.1:{port}", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the {'gRPC ' if protocol == 'grpc' else ''}server" in err
    assert str(port) in err and "Traceback" not in err
