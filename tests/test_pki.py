"""The cluster's keys: certificates chain to the CA, node certificates cannot serve."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw import jointoken, pki


def test_server_cert_has_every_address_as_san() -> None:
    ca = pki.make_ca("t")
    server = pki.make_server_cert(ca, ["10.1.2.3", "cp1.example", "::1"])
    cert = x509.load_pem_x509_certificate(server.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(i) for i in san.get_values_for_type(x509.IPAddress)} == {"10.1.2.3", "::1"}
    assert san.get_values_for_type(x509.DNSName) == ["cp1.example"]
    assert pki.verify_issued_by(server.cert_pem, ca.cert_pem)


def test_node_cert_from_csr_is_client_only_and_named_by_the_control_plane() -> None:
    ca = pki.make_ca("t")
    key_pem, csr_pem = pki.make_csr("asked-name")
    cert_pem, serial = pki.sign_csr(ca, csr_pem, "node7")
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert pki.cert_common_name(cert_pem) == "node7"
    assert cert.serial_number == serial == pki.cert_serial(cert_pem)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert pki.cert_matches_key(cert_pem, key_pem)
    assert not pki.cert_matches_key(cert_pem, pki.make_csr("other")[0])
    assert not pki.verify_issued_by(cert_pem, pki.make_ca("other").cert_pem)


def test_bad_csr_refused() -> None:
    with pytest.raises(pki.PKIError, match="not a PEM certificate request"):
        pki.sign_csr(pki.make_ca("t"), b"-----BEGIN NOTHING-----", "n")


def test_seal_round_trip_and_wrong_secret() -> None:
    secret = pki.new_secret()
    sealed = pki.seal(secret, b"hunter2")
    assert sealed.startswith("sealed1:") and b"hunter2" not in sealed.encode()
    assert pki.unseal(secret, sealed) == b"hunter2"
    with pytest.raises(pki.PKIError, match="does not open"):
        pki.unseal(pki.new_secret(), sealed)


def test_write_private_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "k" / "secret"
    pki.write_private(path, b"x")
    assert path.stat().st_mode & 0o777 == 0o600


def test_tls_contexts_require_certificates_and_h2(tmp_path: Path) -> None:
    ca = pki.make_ca("t")
    server = pki.make_server_cert(ca, ["127.0.0.1"])
    for name, data in {
        "ca.crt": ca.cert_pem,
        "s.crt": server.cert_pem,
        "s.key": server.key_pem,
    }.items():
        (tmp_path / name).write_bytes(data)
    ctx = pki.server_tls(tmp_path / "s.crt", tmp_path / "s.key", tmp_path / "ca.crt")
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_join_token_round_trip_and_macs() -> None:
    token = jointoken.JoinToken("abcd", b"s" * 32, ["10.0.0.1:8080"], "ff" * 32, 2e9)
    parsed = jointoken.parse(token.encode())
    assert parsed == token
    assert not parsed.expired(now=1e9) and parsed.expired(now=3e9)
    mac = jointoken.enroll_mac(token.secret, "n1", b"csr")
    assert jointoken.check(mac, jointoken.enroll_mac(token.secret, "n1", b"csr"))
    # Bound to what it covers: another node id or CSR gives another MAC.
    assert mac != jointoken.enroll_mac(token.secret, "n2", b"csr")
    assert mac != jointoken.enroll_mac(token.secret, "n1", b"csr2")
    assert mac != jointoken.answer_mac(token.secret, b"n1", b"csr")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("hello", "not an llmgw join token"),
        ("llmgw-join-1.AAAA", "damaged"),
        ("llmgw-join-1.!!!", "damaged"),
    ],
)
def test_bad_tokens(text: str, problem: str) -> None:
    with pytest.raises(jointoken.TokenError, match=problem):
        jointoken.parse(text)
