"""gRPC TLS flags: tritonserver's forms, the PEM files checked at start-up (a missing or
unreadable one stops the server, naming the flag and the file)."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from server import tls
from server.cli import parse_settings
from tests.certificates import Pki, make_pki
from tests.server_process import ROOT


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _flags(pki: Pki) -> list[str]:
    return [
        "--model-repository=/m",
        f"--grpc-server-cert={pki.server_cert}",
        f"--grpc-server-key={pki.server_key}",
        f"--grpc-root-cert={pki.ca_cert}",
    ]


def test_off_by_default_and_the_files_are_ignored_then(tmp_path: Path) -> None:
    settings = parse_settings(
        ["--model-repository=/m", f"--grpc-server-cert={tmp_path / 'missing.pem'}"]
    )
    assert (settings.grpc_use_ssl, settings.grpc_use_ssl_mutual) == (False, False)
    assert tls.from_settings(settings) is None


def test_use_ssl_reads_the_server_files(pki: Pki) -> None:
    settings = parse_settings([*_flags(pki), "--grpc-use-ssl=true"])
    files = tls.from_settings(settings)
    assert files is not None
    assert (files.server_cert, files.server_key) == (str(pki.server_cert), str(pki.server_key))
    assert (files.root_cert, files.mutual) == (None, False)  # no use for it without mutual
    context = files.server_context(["h2"])
    assert context.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize("value", ["", "=true", "=false"])
def test_mutual_implies_ssl_whatever_its_value_as_in_tritonserver(pki: Pki, value: str) -> None:
    settings = parse_settings([*_flags(pki), f"--grpc-use-ssl-mutual{value}"])
    assert settings.grpc_use_ssl is True
    assert settings.grpc_use_ssl_mutual is (value != "=false")
    files = tls.from_settings(settings)
    assert files is not None and files.mutual is (value != "=false")


def test_a_later_use_ssl_false_turns_tls_off(pki: Pki) -> None:
    settings = parse_settings([*_flags(pki), "--grpc-use-ssl-mutual", "--grpc-use-ssl=false"])
    assert settings.grpc_use_ssl is False
    assert tls.from_settings(settings) is None


def test_mutual_reads_the_root_certificate(pki: Pki) -> None:
    files = tls.from_settings(parse_settings([*_flags(pki), "--grpc-use-ssl-mutual=true"]))
    assert files is not None
    assert files.root_cert == pki.read("ca_cert")


def _start(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", "--model-repository=/m", *flags],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize("missing", ["cert", "key", "root"])
def test_a_missing_file_stops_the_start_naming_flag_and_file(
    pki: Pki, tmp_path: Path, missing: str
) -> None:
    files = {"cert": pki.server_cert, "key": pki.server_key, "root": pki.ca_cert}
    files[missing] = tmp_path / f"no-{missing}.pem"
    result = _start(
        "--grpc-use-ssl-mutual=true", f"--grpc-server-cert={files['cert']}",
        f"--grpc-server-key={files['key']}", f"--grpc-root-cert={files['root']}",
    )
    assert result.returncode == 1
    flag = {"cert": "--grpc-server-cert", "key": "--grpc-server-key", "root": "--grpc-root-cert"}
    assert (
        f"Error: {flag[missing]}={files[missing]}: No such file or directory" in result.stderr
    ), result.stderr


def test_an_unreadable_or_non_pem_file_stops_the_start(pki: Pki, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    result = _start("--grpc-use-ssl", f"--grpc-server-cert={folder}",
                    f"--grpc-server-key={pki.server_key}")
    assert result.returncode == 1
    assert f"Error: --grpc-server-cert={folder}: Is a directory" in result.stderr
    text = tmp_path / "key.txt"
    text.write_text("not a key\n")
    result = _start("--grpc-use-ssl", f"--grpc-server-cert={pki.server_cert}",
                    f"--grpc-server-key={text}")
    assert result.returncode == 1
    assert f"Error: --grpc-server-key={text}: not a PEM file" in result.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--grpc-use-ssl"], "Error: --grpc-use-ssl needs --grpc-server-cert=<PEM file>"),
        (["--grpc-use-ssl-mutual", "--grpc-server-cert={cert}", "--grpc-server-key={key}"],
         "Error: --grpc-use-ssl-mutual needs --grpc-root-cert=<PEM file>"),
    ],
)
def test_a_file_not_given_stops_the_start(pki: Pki, flags: list[str], message: str) -> None:
    result = _start(*(f.format(cert=pki.server_cert, key=pki.server_key) for f in flags))
    assert result.returncode == 1
    assert message in result.stderr


def test_files_are_not_checked_with_grpc_off(tmp_path: Path) -> None:
    settings = parse_settings(
        ["--model-repository=/m", "--allow-grpc=false", "--grpc-use-ssl",
         f"--grpc-server-cert={tmp_path / 'missing.pem'}"]
    )
    assert settings.grpc_use_ssl is True


def test_a_key_not_of_the_certificate_stops_the_start(pki: Pki, tmp_path: Path) -> None:
    """OpenSSL's check at start-up: grpc itself would only fail to bind the port."""
    result = _start("--grpc-use-ssl", f"--grpc-server-cert={pki.server_cert}",
                    f"--grpc-server-key={pki.client_key}")
    assert result.returncode == 1
    assert (
        f"Error: --grpc-server-cert={pki.server_cert} and --grpc-server-key={pki.client_key} "
        "are not a certificate and its unencrypted private key: KEY_VALUES_MISMATCH"
    ) in result.stderr


def test_an_encrypted_key_is_refused_without_prompting(pki: Pki, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "ec", "-in", str(pki.server_key), "-aes256", "-passout", "pass:secret",
         "-out", str(encrypted)],
        check=True, capture_output=True, timeout=60,
    )
    with pytest.raises(tls.TlsError, match="not a certificate and its unencrypted private key"):
        tls.read_files(True, False, str(pki.server_cert), str(encrypted), None)


def test_a_root_certificate_file_without_certificates_stops_the_start(pki: Pki) -> None:
    with pytest.raises(tls.TlsError, match=f"--grpc-root-cert={pki.client_key}: not CA"):
        tls.read_files(True, True, str(pki.server_cert), str(pki.server_key),
                       str(pki.client_key))
