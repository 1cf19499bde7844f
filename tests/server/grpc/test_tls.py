"""gRPC over TLS (``--grpc-use-ssl``) and mutual TLS (``--grpc-use-ssl-mutual``) on a live
server: a client trusting the CA is served, NVIDIA's client with ``ssl=True`` included; a
plaintext client and, with mutual TLS, a client without a certificate are not; HTTP stays
plain."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from server import event_loop
from tests.certificates import Pki, make_pki
from tests.server.grpc.helpers import simple_inputs
from tests.server_process import EXAMPLES, ServerProcess, start_server

_DEADLINE_SECS = 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _start(pki: Pki, mode: str) -> ServerProcess:
    process = start_server(
        EXAMPLES,
        args=(
            mode,
            f"--grpc-server-cert={pki.server_cert}",
            f"--grpc-server-key={pki.server_key}",
            f"--grpc-root-cert={pki.ca_cert}",
        ),
    )
    assert process.grpc_port is not None, process.log
    return process


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[ServerProcess]:
    process = _start(pki, "--grpc-use-ssl=true")
    yield process
    assert process.stop() == 0, process.log


@pytest.fixture(scope="module")
def mutual_server(pki: Pki) -> Iterator[ServerProcess]:
    process = _start(pki, "--grpc-use-ssl-mutual=true")
    yield process
    assert process.stop() == 0, process.log


def _live(target: str, credentials: grpc.ChannelCredentials | None) -> bool:
    """ServerLive over a fresh channel: TLS with ``credentials``, plaintext with None."""

    async def call() -> bool:
        channel = (
            grpc.aio.insecure_channel(target)
            if credentials is None
            else grpc.aio.secure_channel(target, credentials)
        )
        async with channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = await stub.ServerLive(
                service_pb2.ServerLiveRequest(), timeout=_DEADLINE_SECS
            )
            return bool(answer.live)

    return event_loop.run(call())


def _refused(target: str, credentials: grpc.ChannelCredentials | None) -> None:
    """The call fails at the connection (never reaching the service)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        _live(target, credentials)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value


def test_tls_serves_a_client_trusting_the_ca(tls_server: ServerProcess, pki: Pki) -> None:
    trusting = grpc.ssl_channel_credentials(root_certificates=pki.read("ca_cert"))
    assert _live(tls_server.grpc_url, trusting)
    # A client certificate is not asked for, but may be sent.
    with_cert = grpc.ssl_channel_credentials(
        pki.read("ca_cert"), pki.read("client_key"), pki.read("client_cert")
    )
    assert _live(tls_server.grpc_url, with_cert)


def test_tls_refuses_plaintext_and_untrusting_clients(tls_server: ServerProcess, pki: Pki) -> None:
    _refused(tls_server.grpc_url, None)
    _refused(tls_server.grpc_url, grpc.ssl_channel_credentials())  # system CAs only
    # refused for the credentials, not for a dead server
    trusting = grpc.ssl_channel_credentials(root_certificates=pki.read("ca_cert"))
    assert _live(tls_server.grpc_url, trusting)


def test_tritonclient_with_ssl(tls_server: ServerProcess, pki: Pki) -> None:
    client = grpcclient.InferenceServerClient(
        tls_server.grpc_url, ssl=True, root_certificates=str(pki.ca_cert)
    )
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        result = client.infer("simple", simple_inputs())
        assert (result.as_numpy("OUTPUT0") == 2).all()
    finally:
        client.close()
    plain = grpcclient.InferenceServerClient(tls_server.grpc_url)
    try:
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=_DEADLINE_SECS)
    finally:
        plain.close()


def test_large_replies_over_tls_each_carry_their_own_data(
    tls_server: ServerProcess, pki: Pki
) -> None:
    """4 MiB outputs, several at once: replies written from the executor's arena go through
    the TLS transport (which encrypts what it holds later) whole and unmixed."""
    client = grpcclient.InferenceServerClient(
        tls_server.grpc_url, ssl=True, root_certificates=str(pki.ca_cert)
    )
    try:
        results: list[tuple[int, grpcclient.InferResult | InferenceServerException]] = []
        done = threading.Semaphore(0)
        for i in range(6):
            data = np.full((1, 1 << 20), float(i), dtype=np.float32)
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)

            def answered(
                result: grpcclient.InferResult,
                error: InferenceServerException | None,
                i: int = i,
            ) -> None:
                results.append((i, error or result))
                done.release()

            client.async_infer("identity_fp32", [tensor], answered)
        for _ in range(6):
            assert done.acquire(timeout=30)
        for i, result in results:
            assert not isinstance(result, InferenceServerException), result
            output = result.as_numpy("OUTPUT0")
            assert output.shape == (1, 1 << 20) and (output == float(i)).all()
    finally:
        client.close()


def test_http_stays_plain(tls_server: ServerProcess) -> None:
    assert tls_server.request("GET", "/v2/health/ready")[0] == 200


def test_mutual_tls_needs_a_client_certificate(mutual_server: ServerProcess, pki: Pki) -> None:
    with_cert = grpc.ssl_channel_credentials(
        pki.read("ca_cert"), pki.read("client_key"), pki.read("client_cert")
    )
    assert _live(mutual_server.grpc_url, with_cert)
    _refused(mutual_server.grpc_url, grpc.ssl_channel_credentials(pki.read("ca_cert")))
    _refused(mutual_server.grpc_url, None)
    assert _live(mutual_server.grpc_url, with_cert)  # still serving a good client


def test_mutual_tls_refuses_a_certificate_of_another_ca(
    mutual_server: ServerProcess, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = make_pki(tmp_path_factory.mktemp("other_pki"))
    foreign = grpc.ssl_channel_credentials(
        pki.read("ca_cert"), other.read("client_key"), other.read("client_cert")
    )
    _refused(mutual_server.grpc_url, foreign)
    with_cert = grpc.ssl_channel_credentials(
        pki.read("ca_cert"), pki.read("client_key"), pki.read("client_cert")
    )
    assert _live(mutual_server.grpc_url, with_cert)  # refused for the certificate alone


def test_tritonclient_with_mutual_tls(mutual_server: ServerProcess, pki: Pki) -> None:
    client = grpcclient.InferenceServerClient(
        mutual_server.grpc_url, ssl=True, root_certificates=str(pki.ca_cert),
        private_key=str(pki.client_key), certificate_chain=str(pki.client_cert),
    )
    try:
        result = client.infer("simple", simple_inputs())
        assert (result.as_numpy("OUTPUT1") == 0).all()
    finally:
        client.close()
