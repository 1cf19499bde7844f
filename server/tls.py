"""gRPC TLS (``--grpc-use-ssl``, ``--grpc-use-ssl-mutual``): its PEM files, read and checked
at start-up so that a missing or unreadable one stops the server with a line naming the flag
and the file, instead of a failed bind or handshakes failing later. No grpc here: the
supervisor checks the files too, and it never imports grpc."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from server.settings import Settings


class TlsError(ValueError):
    """A TLS flag's file is missing, unreadable or not PEM; the message names both."""


@dataclass(frozen=True)
class TlsFiles:
    """What the gRPC port's TLS credentials are made of."""

    server_cert: str  # path of the PEM certificate chain
    server_key: str  # path of the PEM private key
    root_cert: bytes | None  # PEM CA certificates client certificates are checked against
    mutual: bool  # clients must present a certificate the root certificates verify

    def server_context(self, alpn: list[str]) -> ssl.SSLContext:
        """A server's TLS context with these files, offering ``alpn``'s protocols; with
        ``mutual``, clients must present a certificate the root certificates verify."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.server_cert, self.server_key, password=_no_password)
        context.set_alpn_protocols(alpn)
        if self.mutual and self.root_cert is not None:
            context.load_verify_locations(cadata=self.root_cert.decode("ascii"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def read_files(
    use_ssl: bool, mutual: bool, server_cert: str | None, server_key: str | None,
    root_cert: str | None,
) -> TlsFiles | None:
    """The files of these flags' values (None: TLS is off); ``TlsError`` naming the flag and
    the file when one is missing, unreadable or not PEM. The root certificate is read only
    with mutual TLS, the one use a server has for it (as in Triton, it is ignored otherwise)."""
    if not use_ssl:
        return None
    _read("--grpc-server-cert", server_cert, "--grpc-use-ssl")
    _read("--grpc-server-key", server_key, "--grpc-use-ssl")
    files = TlsFiles(
        server_cert=server_cert or "",
        server_key=server_key or "",
        root_cert=_read("--grpc-root-cert", root_cert, "--grpc-use-ssl-mutual") if mutual else None,
        mutual=mutual,
    )
    # OpenSSL's own check that they are a certificate and its key (and CA certificates):
    # grpc would only log "Invalid private key" and fail to bind the port.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(server_cert or "", server_key, password=_no_password)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(
            f"--grpc-server-cert={server_cert} and --grpc-server-key={server_key} are not a "
            f"certificate and its unencrypted private key: {_reason(exc)}"
        ) from None
    if mutual:
        try:
            context.load_verify_locations(cafile=root_cert)
        except (ssl.SSLError, OSError) as exc:
            raise TlsError(
                f"--grpc-root-cert={root_cert}: not CA certificates: {_reason(exc)}"
            ) from None
    return files


def from_settings(settings: Settings) -> TlsFiles | None:
    """``read_files`` of the server's flags."""
    return read_files(
        settings.grpc_use_ssl, settings.grpc_use_ssl_mutual, settings.grpc_server_cert,
        settings.grpc_server_key, settings.grpc_root_cert,
    )


def _no_password() -> bytes:
    return b""  # an encrypted key fails instead of prompting on the terminal


def _reason(exc: OSError) -> str:
    return getattr(exc, "reason", None) or exc.strerror or str(exc)


def _read(flag: str, path: str | None, needed_by: str) -> bytes:
    if not path:
        raise TlsError(f"{needed_by} needs {flag}=<PEM file>")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"{flag}={path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"{flag}={path}: not a PEM file")
    return data
