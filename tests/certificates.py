"""Throw-away PKI for the TLS tests: a CA, a server certificate for 127.0.0.1 and localhost,
and a client certificate, all signed by the CA, made with the ``openssl`` command."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def read(self, name: str) -> bytes:
        path: Path = getattr(self, name)
        return path.read_bytes()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _issue(folder: Path, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate signed by the CA in ``folder``, with ``extensions``."""
    extfile = folder / f"{name}.ext"
    extfile.write_text(extensions + "\n")
    _openssl(
        "req", *_EC, "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.csr"),
        "-subj", subject,
    )
    _openssl(
        "x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA", str(folder / "ca.pem"),
        "-CAkey", str(folder / "ca.key"), "-CAcreateserial", "-days", "2",
        "-out", str(folder / f"{name}.pem"), "-extfile", str(extfile),
    )


def make_pki(folder: Path) -> Pki:
    """Generate the files in ``folder``; skips the test where there is no ``openssl``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    _openssl(
        "req", "-x509", *_EC, "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem"),
        "-days", "2", "-subj", "/CN=tensorgate test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )
    _issue(
        folder, "server", "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth",
    )
    _issue(folder, "client", "/CN=tensorgate test client", "extendedKeyUsage=clientAuth")
    return Pki(
        ca_cert=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
    )
