"""Shared fixtures: servers started as subprocesses on free ports, once per test worker."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from server import logs
from tests.model_repos import build_datatype_repository
from tests.server_process import EXAMPLES, ServerProcess, record_layout_module, start_server


def pytest_configure(config: pytest.Config) -> None:
    """Servers under test take SIGINT as a terminal sends it, also when the suite was started
    in the background: there SIGINT is ignored, every child inherits that, and a server that
    finds it ignored keeps it so (as it should), so the tests that stop one with SIGINT would
    wait in vain. A handler, unlike "ignored", is not inherited across exec."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of the session's ``server`` follows the layout of the run (``server_process``
    notes the modules that start servers of their own). A module's own fixture of that name
    does not count: its server notes itself, unless it sets a layout of its own."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.get("server", ()) if info is not None else ()
    if definitions and definitions[-1].func.__module__ == __name__:
        record_layout_module(item.nodeid)


@pytest.fixture(scope="session")
def datatype_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_datatype_repository(tmp_path_factory.mktemp("datatype_repo"))


@pytest.fixture(scope="session")
def server(datatype_repository: Path) -> Iterator[ServerProcess]:
    """One server with the example repository and the datatype test models."""
    process = start_server(EXAMPLES, datatype_repository)
    assert process.port is not None, process.log
    yield process
    process.stop()


@pytest.fixture
def connect() -> Iterator[Callable[..., Any]]:
    """Opens tritonclient clients (``connect(tritonclient.http, url)``) and closes them after
    the test. A client left open is closed by the garbage collector, in whichever later test it
    runs, and its socket may be finalized first: a ResourceWarning that fails that test."""
    opened: list[Any] = []

    def open_client(module: Any, url: str, **options: Any) -> Any:
        client = module.InferenceServerClient(url, **options)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()


@pytest.fixture
def assert_still_serving(server: ServerProcess) -> Iterator[None]:
    """After a test that sends bad input: the server must still answer a good request."""
    yield
    good = (
        b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":'
        + str(list(range(16))).encode()
        + b'},{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":'
        + str([1] * 16).encode()
        + b"}]}"
    )
    status, _, body = server.request("POST", "/v2/models/simple/infer", good)
    assert status == 200, body
    assert b'"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]' in body


@pytest.fixture
def root_logging() -> Iterator[None]:
    """For tests of code that configures the root logger (``logs.configure``, ``main``): put
    pytest's handlers and level back afterwards, and the log settings ``logs`` keeps."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    settings, handler = logs.current(), logs._handler
    yield
    logs._current.update(settings)
    logs._handler = handler
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
