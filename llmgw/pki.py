"""The cluster's keys: its CA, server and node certificates, sealing, and TLS contexts.

Keys are ECDSA P-256. The CA is made once at ``server init``; a node's key is made on the
node and never leaves it (it sends a CSR). Node certificates carry the node id as their
CN and are good for client authentication only, so one cannot pose as a control plane.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_YEARS = 10
SERVER_YEARS = 5
NODE_YEARS = 2


class PKIError(ValueError):
    """A certificate, key or sealed value that cannot be used."""


@dataclass(frozen=True)
class KeyPair:
    key_pem: bytes
    cert_pem: bytes


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PKIError("expected an ECDSA private key")
    return key


def make_ca(cluster_name: str) -> KeyPair:
    key = new_key()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"llmgw cluster CA {cluster_name}"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365 * CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for name in names:
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _issue(
    ca: KeyPair,
    subject_cn: str,
    public_key: ec.EllipticCurvePublicKey,
    years: int,
    usage: x509.ObjectIdentifier,
    sans: list[str] | None = None,
) -> x509.Certificate:
    ca_key = _load_key(ca.key_pem)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365 * years))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(_san(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_server_cert(ca: KeyPair, names: list[str]) -> KeyPair:
    """The control plane's certificate, with every address it is reached at as a SAN."""
    key = new_key()
    cert = _issue(
        ca, names[0], key.public_key(), SERVER_YEARS, ExtendedKeyUsageOID.SERVER_AUTH, names
    )
    return KeyPair(key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def make_csr(node_id: str) -> tuple[bytes, bytes]:
    """A node's new key and its CSR, both PEM; the key stays on the node."""
    key = new_key()
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .sign(key, hashes.SHA256())
    )
    return key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


def _csr_key(csr_pem: bytes) -> ec.EllipticCurvePublicKey:
    """The key a CSR asks a certificate for, once the CSR is whole and self-signed."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise PKIError(f"the CSR is not a PEM certificate request: {exc}") from exc
    if not csr.is_signature_valid:
        raise PKIError("the CSR's signature does not match its key")
    public = csr.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise PKIError("the CSR must hold an ECDSA key")
    return public


def sign_csr(ca: KeyPair, csr_pem: bytes, node_id: str) -> tuple[bytes, int]:
    """Sign a node's CSR as a client certificate for ``node_id``; returns PEM and serial."""
    public = _csr_key(csr_pem)
    cert = _issue(ca, node_id, public, NODE_YEARS, ExtendedKeyUsageOID.CLIENT_AUTH)
    return cert.public_bytes(serialization.Encoding.PEM), cert.serial_number


# A control plane's certificate on the control planes' link is named so: a node id cannot
# hold ':', so no node's certificate can pass for a control plane's.
PEER_PREFIX = "llmgw-server:"


def _peer_cert(ca: KeyPair, name: str, public: ec.EllipticCurvePublicKey, sans: list[str]) -> bytes:
    ca_key = _load_key(ca.key_pem)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, PEER_PREFIX + name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365 * SERVER_YEARS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(_san(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def make_peer_cert(ca: KeyPair, name: str, sans: list[str]) -> KeyPair:
    """A control plane's certificate for the control planes' link (both ends of it), made
    where the CA's key is."""
    key = new_key()
    return KeyPair(key_pem(key), _peer_cert(ca, name, key.public_key(), sans))


def sign_peer_csr(ca: KeyPair, csr_pem: bytes, name: str, sans: list[str]) -> tuple[bytes, int]:
    """Sign a joining control plane's CSR: its certificate for the agents' port and the
    control planes' link; returns PEM and serial."""
    pem = _peer_cert(ca, name, _csr_key(csr_pem), sans)
    return pem, cert_serial(pem)


def peer_name(cert_pem_or_cn: str) -> str | None:
    """The control plane a certificate's common name names, or None."""
    cn = cert_pem_or_cn
    return cn[len(PEER_PREFIX) :] if cn.startswith(PEER_PREFIX) else None


def identity(cert: Mapping[str, object] | None) -> tuple[str, int] | None:
    """(common name, serial) of a TLS peer's certificate as ``getpeercert()`` gives it:
    ``subject`` a tuple of RDNs, each a tuple of (key, value) pairs."""
    if not cert:
        return None
    cn = ""
    subject = cert.get("subject", ())
    for rdn in subject if isinstance(subject, tuple | list) else ():
        for key, value in rdn:
            if key == "commonName":
                cn = value
    serial = cert.get("serialNumber")
    if not cn or not isinstance(serial, str) or not serial:
        return None
    return cn, int(serial, 16)


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the certificate's DER, hex: what a join token pins."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.fingerprint(hashes.SHA256()).hex()


def cert_common_name(cert_pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem)
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def cert_serial(cert_pem: bytes) -> int:
    return x509.load_pem_x509_certificate(cert_pem).serial_number


def cert_matches_key(cert_pem: bytes, private_pem: bytes) -> bool:
    cert_pub = x509.load_pem_x509_certificate(cert_pem).public_key()
    key_pub = _load_key(private_pem).public_key()
    der = serialization.Encoding.DER
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return cert_pub.public_bytes(der, spki) == key_pub.public_bytes(der, spki)


def verify_issued_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):
        return False
    return True


# --- secrets --------------------------------------------------------------------------


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def _seal_key(cluster_secret: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"llmgw seal v1").derive(cluster_secret)


def seal(cluster_secret: bytes, plaintext: bytes) -> str:
    """Encrypt a secret for the store: AES-GCM under a key derived from the cluster secret."""
    nonce = os.urandom(12)
    ct = AESGCM(_seal_key(cluster_secret)).encrypt(nonce, plaintext, b"llmgw")
    return "sealed1:" + base64.b64encode(nonce + ct).decode()


def unseal(cluster_secret: bytes, sealed: str) -> bytes:
    if not sealed.startswith("sealed1:"):
        raise PKIError("not a sealed value")
    raw = base64.b64decode(sealed[len("sealed1:") :])
    try:
        return AESGCM(_seal_key(cluster_secret)).decrypt(raw[:12], raw[12:], b"llmgw")
    except Exception as exc:
        raise PKIError("sealed value does not open with this cluster's secret") from exc


def _token_key(token_secret: bytes, context: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"llmgw join seal v1" + context).derive(
        token_secret
    )


def seal_for_token(token_secret: bytes, context: bytes, plaintext: bytes) -> bytes:
    """Encrypt what a joining control plane receives (the cluster's secret and CA key)
    under its token's secret, bound to ``context`` (its name and CSR): only the holder
    of the token can open it, and only for that request."""
    nonce = os.urandom(12)
    return nonce + AESGCM(_token_key(token_secret, context)).encrypt(nonce, plaintext, context)


def open_for_token(token_secret: bytes, context: bytes, sealed: bytes) -> bytes:
    try:
        key = _token_key(token_secret, context)
        return AESGCM(key).decrypt(sealed[:12], sealed[12:], context)
    except Exception as exc:
        raise PKIError("the answer does not open with this token (altered on the way?)") from exc


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_admin_token() -> str:
    """An admin token (``server init`` makes the first, a rotation each next one)."""
    return "llmgw-admin-" + secrets.token_urlsafe(32)


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


# --- TLS ------------------------------------------------------------------------------


def server_tls(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """The agents' port: TLS 1.2+, HTTP/2 only, a client certificate from our CA required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    return ctx


def client_tls(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """An agent's side: trust only the cluster CA, present the node certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(ca)
    ctx.load_cert_chain(cert, key)
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    return ctx


def peer_tls(cert: Path, key: Path, ca: Path, *, server: bool) -> ssl.SSLContext:
    """The control planes' link, either end: TLS 1.2+, HTTP/1.1, the other end's
    certificate from our CA required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    if not server:
        ctx.check_hostname = True
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read, created so from the start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def replace_private(path: Path, data: bytes) -> None:
    """Replace a file only its owner can read, atomically: a reader finds the old
    contents or the new, never a part, and never a moment the file is readable by
    others (the new one is written beside it, 0600 from the start, then renamed)."""
    part = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    try:
        write_private(part, data)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def engine_key(cluster_secret: bytes, replica_id: str) -> str:
    """A replica's engine API key: derived, so any control plane can recompute it and none
    needs to store it."""
    digest = hmac.new(cluster_secret, b"llmgw engine key\x00" + replica_id.encode(), "sha256")
    return "llmgw-engine-" + digest.hexdigest()[:40]


def metrics_token(cluster_secret: bytes) -> str:
    """The cluster's metrics token: what Prometheus sends to read ``/metrics``, the
    targets of ``http_sd_configs`` and each agent's own metrics. Derived like
    ``engine_key``, so every control plane of the cluster has the same one; the agents
    are given it over their stream."""
    digest = hmac.new(cluster_secret, b"llmgw metrics token\x00", "sha256")
    return "llmgw-metrics-" + digest.hexdigest()[:40]
