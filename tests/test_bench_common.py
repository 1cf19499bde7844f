"""The interpreter's build as the benchmarks report it (``scripts.bench_common.python_build``),
and the socket echo baseline, served on the server's event loop."""

from __future__ import annotations

import socket
import sys

from scripts.bench_common import (
    EchoServer,
    echo_request,
    interpreter_line,
    machine_facts,
    python_build,
)
from server import event_loop

_SHARED_MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234 /opt/python/bin/python3.11
7f1e2c000000-7f1e2c200000 r-xp 00000000 08:01 5678 /opt/python/lib/libpython3.11.so.1.0
7f1e2d000000-7f1e2d100000 r-xp 00000000 08:01 9012 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd1a000000-7ffd1a021000 rw-p 00000000 00:00 0 [stack]
"""
_STATIC_MAPS = """\
55d0c0a00000-55d0c0f01000 r-xp 00000000 08:01 1234 /usr/bin/python3.11
7f1e2b000000-7f1e2b100000 r-xp 00000000 08:01 3456 /opt/libpython-tools/lib/helper.so
7f1e2d000000-7f1e2d100000 r-xp 00000000 08:01 9012 /usr/lib/x86_64-linux-gnu/libc.so.6
"""
_PLAIN_ARGS = "'--prefix=/opt/python' '--enable-shared' 'LDFLAGS=-L/opt/python/lib'"
_OPTIMISED_ARGS = "'--prefix=/opt/python' '--enable-optimizations' '--with-lto=full'"
_NOT_OPTIMISED = "configured without --enable-optimizations or --with-lto"


def test_a_shared_libpython_is_named() -> None:
    assert python_build(_SHARED_MAPS, _PLAIN_ARGS) == (
        f"libpython loaded as a shared library; {_NOT_OPTIMISED}"
    )


def test_a_replaced_libpython_still_counts() -> None:
    # The path is the sixth field to the end of the line: it may hold spaces and "(deleted)".
    maps = _SHARED_MAPS.replace("/opt/python/lib/libpython3.11.so.1.0",
                                "/opt/my python/lib/libpython3.11.so.1.0 (deleted)")
    assert python_build(maps, _PLAIN_ARGS).startswith("libpython loaded as a shared library")


def test_an_interpreter_linked_into_the_executable() -> None:
    # Only a mapped file's own name counts: a folder named like libpython does not.
    assert python_build(_STATIC_MAPS, _PLAIN_ARGS) == (
        f"interpreter linked into the executable; {_NOT_OPTIMISED}"
    )


def test_optimisation_flags_are_read_from_quoted_configure_arguments() -> None:
    assert python_build(_STATIC_MAPS, _OPTIMISED_ARGS) == (
        "interpreter linked into the executable; "
        "configured with --enable-optimizations --with-lto"
    )


def test_unreadable_maps_say_unknown() -> None:
    assert python_build("", "") == f"libpython linking unknown; {_NOT_OPTIMISED}"


def test_the_machine_facts_carry_this_interpreter_s_build() -> None:
    described = python_build()
    assert machine_facts()["python"] == f"{sys.version.split()[0]} ({described})"
    assert described.split(";")[0] in (
        "libpython loaded as a shared library", "interpreter linked into the executable"
    )


def test_the_interpreter_line_names_version_build_and_server() -> None:
    assert interpreter_line("tensorgate") == (
        f"python {sys.version.split()[0]} (tensorgate's too): {python_build()}."
    )


def test_the_echo_server_answers_the_length_asked_for_on_the_servers_loop() -> None:
    echo = EchoServer()
    try:
        with socket.create_connection(echo.address, timeout=10) as client:
            for request, reply in ((100, 40), (64, 300)):  # cut, then zero-padded
                message = echo_request(request, reply)
                client.sendall(message)
                answer = b""
                while len(answer) < reply:
                    chunk = client.recv(reply - len(answer))
                    assert chunk, "the echo server hung up"
                    answer += chunk
                assert answer == (message + bytes(max(0, reply - request)))[:reply]
        with open(f"/proc/{echo.pid}/maps") as maps:
            assert ("uvloop" in maps.read()) == (event_loop.loop_factory() is not None)
    finally:
        echo.stop()
