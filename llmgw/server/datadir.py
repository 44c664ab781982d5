"""The control plane's data directory: its layout, ``server init``, and reading it back.

Layout::

    server.yaml      settings (strictly checked)
    cluster.key      32 random bytes: seals secrets in the store, derives engine keys (0600)
    admin.token      the admin token, for ctl on this machine (0600; the leader rewrites it
                     when the token is rotated)
    pki/ca.crt ca.key server.crt server.key
    pki/peer.crt peer.key   this control plane on the control planes' link
    store.db         SQLite (the default store)

``init`` makes a new one and refuses an existing one; ``ensure`` (``server init
--config``, for Kubernetes and other orchestrators) makes or brings one up to date from a
given server.yaml on every start, taking the CA, cluster key and admin token from a
directory (a mounted Secret) when given one, and seeds the store only once.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from llmgw import pki
from llmgw.config import ConfigError, ServerConfig, build, dump, load, parse_hostport


class InitError(RuntimeError):
    """``server init`` cannot go on, and why."""


@dataclass(frozen=True)
class DataDir:
    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / "server.yaml"

    @property
    def cluster_key(self) -> Path:
        return self.root / "cluster.key"

    @property
    def admin_token(self) -> Path:
        return self.root / "admin.token"

    @property
    def ca_cert(self) -> Path:
        return self.root / "pki" / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "pki" / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "pki" / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.root / "pki" / "server.key"

    @property
    def peer_cert(self) -> Path:
        return self.root / "pki" / "peer.crt"

    @property
    def peer_key(self) -> Path:
        return self.root / "pki" / "peer.key"

    def existing(self) -> list[str]:
        """The parts of an initialised data dir already present, relative to it."""
        parts = [
            self.config_path,
            self.cluster_key,
            self.admin_token,
            self.ca_cert,
            self.ca_key,
            self.server_cert,
            self.server_key,
            self.root / "store.db",
        ]
        return [str(p.relative_to(self.root)) for p in parts if p.exists()]

    def load_config(self) -> ServerConfig:
        if not self.config_path.exists():
            raise ConfigError(
                f"{self.config_path} does not exist: run `llmgw server init "
                f"--data-dir {self.root}` first"
            )
        return load(ServerConfig, self.config_path)

    def remember_role(self, role: str, leader: str | None) -> None:
        """Write this control plane's role (and a standby's leader) into server.yaml,
        so a restart takes the role it had."""
        import dataclasses

        config = self.load_config()
        ha = dataclasses.replace(config.ha, role=role, leader=leader)
        new = dataclasses.replace(config, ha=ha)
        tmp = self.config_path.with_suffix(".yaml.new")
        tmp.write_text("# llmgw control plane settings; see docs/configuration.md\n" + dump(new))
        tmp.replace(self.config_path)

    def ensure_peer_cert(self, name: str, sans: list[str]) -> int:
        """This control plane's certificate on the control planes' link, made now from
        the CA when a data dir from before standbys lacks one; returns its serial."""
        if not self.peer_cert.exists():
            pair = pki.make_peer_cert(self.ca(), name, sans)
            pki.write_private(self.peer_key, pair.key_pem)
            self.peer_cert.write_bytes(pair.cert_pem)
        return pki.cert_serial(self.peer_cert.read_bytes())

    def cluster_secret(self) -> bytes:
        return self.cluster_key.read_bytes()

    def metrics_token(self) -> str:
        """The cluster's metrics token, also written to ``metrics.token`` (only its
        owner reads it) for Prometheus's ``credentials_file``."""
        token = pki.metrics_token(self.cluster_secret())
        path = self.root / "metrics.token"
        if not path.exists() or path.read_text().strip() != token:
            pki.replace_private(path, (token + "\n").encode())
        return token

    def ca(self) -> pki.KeyPair:
        return pki.KeyPair(self.ca_key.read_bytes(), self.ca_cert.read_bytes())


def local_addresses() -> list[str]:
    """This machine's unicast addresses, IPv4 first, loopback and link-local left out."""
    v4: list[str] = []
    v6: list[str] = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                v4.append(a.address)
            elif a.family == socket.AF_INET6:
                ip = a.address.split("%")[0]
                if ip != "::1" and not ip.lower().startswith("fe80"):
                    v6.append(ip)
    return v4 + v6


def default_advertise(listen_host: str) -> list[str]:
    """Where agents should reach a control plane that listens on ``listen_host``."""
    if listen_host not in ("0.0.0.0", "::", ""):
        return [listen_host]
    found = local_addresses()
    return (found[:1] + [socket.gethostname()] + found[1:]) if found else ["127.0.0.1"]


def init(
    root: Path,
    *,
    listen: str = "0.0.0.0:8080",
    agent_port: int = 8443,
    advertise: list[str] | None = None,
    name: str | None = None,
    peer_port: int = 8444,
    store: str = "sqlite",
    dsn: str | None = None,
) -> tuple[ServerConfig, str]:
    """Make a new data dir; returns its settings and the admin token (shown once)."""
    data = DataDir(root)
    present = data.existing()
    if present:
        raise InitError(
            f"{root} is already initialised ({', '.join(present)} exist); nothing was "
            "changed. Use another --data-dir, or remove this one to start over."
        )
    listen_host, _ = parse_hostport(listen)
    config = build(
        ServerConfig,
        {
            "listen": listen,
            "agent_port": agent_port,
            "advertise": advertise or default_advertise(listen_host),
            "ha": {"name": name or socket.gethostname(), "peer_port": peer_port},
            "store": {"backend": store, **({"dsn": dsn} if dsn else {})},
        },
        "server init",
    )
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    (root / "pki").mkdir(exist_ok=True)

    sans = _server_sans(config)
    ca = pki.make_ca(socket.gethostname())
    server = pki.make_server_cert(ca, sans)
    pki.write_private(data.ca_key, ca.key_pem)
    data.ca_cert.write_bytes(ca.cert_pem)
    pki.write_private(data.server_key, server.key_pem)
    data.server_cert.write_bytes(server.cert_pem)
    pki.write_private(data.cluster_key, pki.new_secret())
    peer = pki.make_peer_cert(ca, config.ha.name, sans)
    pki.write_private(data.peer_key, peer.key_pem)
    data.peer_cert.write_bytes(peer.cert_pem)

    token = pki.new_admin_token()
    asyncio.run(_create_store(data, config, token))
    pki.write_private(data.admin_token, (token + "\n").encode())
    data.config_path.write_text(
        "# llmgw control plane settings; see docs/configuration.md\n" + dump(config)
    )
    return config, token


def _server_sans(config: ServerConfig) -> list[str]:
    listen_host, _ = parse_hostport(config.listen)
    sans = list(config.advertise)
    sans += [socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", "::1"]
    if listen_host not in ("0.0.0.0", "::"):
        sans.append(listen_host)
    return sans


# What a keys directory (``server init --keys``) holds, and where each goes.
KEY_FILES = ("ca.crt", "ca.key", "cluster.key", "admin.token")


def ensure(root: Path, config_file: Path, keys: Path | None = None) -> ServerConfig:
    """Make the data dir at ``root`` or bring it up to date, for a process started anew
    each time from the same settings (a Kubernetes pod): server.yaml becomes
    ``config_file``'s; the CA, cluster key and admin token are ``keys``' files when given
    (KEY_FILES), else kept, or made when absent; the server and peer certificates are
    issued again for the advertised addresses (they may have changed); the store is
    seeded only when it has no cluster yet, and refused, with nothing written, when it
    holds another CA's."""
    config = load(ServerConfig, config_file)
    data = DataDir(root)
    ca, cluster_key, token_text = _given_keys(keys) if keys else _kept_keys(data)
    token = token_text.decode().strip()
    if not token:
        raise InitError(f"{keys or data.admin_token}: the admin token is empty")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    asyncio.run(_create_store(data, config, token, ca.cert_pem, only_if_new=True))

    (root / "pki").mkdir(exist_ok=True)
    pki.replace_private(data.ca_key, ca.key_pem)
    data.ca_cert.write_bytes(ca.cert_pem)
    pki.replace_private(data.cluster_key, cluster_key)
    pki.replace_private(data.admin_token, token_text)
    sans = _server_sans(config)
    server = pki.make_server_cert(ca, sans)
    pki.replace_private(data.server_key, server.key_pem)
    data.server_cert.write_bytes(server.cert_pem)
    peer = pki.make_peer_cert(ca, config.ha.name or socket.gethostname(), sans)
    pki.replace_private(data.peer_key, peer.key_pem)
    data.peer_cert.write_bytes(peer.cert_pem)
    tmp = data.config_path.with_suffix(".yaml.new")
    tmp.write_text(config_file.read_text())
    tmp.replace(data.config_path)
    return config


def _given_keys(keys: Path) -> tuple[pki.KeyPair, bytes, bytes]:
    missing = [n for n in KEY_FILES if not (keys / n).is_file()]
    if missing:
        raise InitError(
            f"{keys} lacks {', '.join(missing)}: the Secret mounted there must hold "
            f"{', '.join(KEY_FILES)} (docs/kubernetes.md shows how to make it)"
        )
    ca = pki.KeyPair((keys / "ca.key").read_bytes(), (keys / "ca.crt").read_bytes())
    if not pki.cert_matches_key(ca.cert_pem, ca.key_pem):
        raise InitError(f"{keys}: ca.crt is not the certificate of ca.key")
    return ca, (keys / "cluster.key").read_bytes(), (keys / "admin.token").read_bytes()


def _kept_keys(data: DataDir) -> tuple[pki.KeyPair, bytes, bytes]:
    """The data dir's CA, cluster key and admin token; each made when absent."""
    ca = data.ca() if data.ca_key.exists() else pki.make_ca(socket.gethostname())
    cluster_key = data.cluster_secret() if data.cluster_key.exists() else pki.new_secret()
    token = (
        data.admin_token.read_bytes()
        if data.admin_token.exists()
        else (pki.new_admin_token() + "\n").encode()
    )
    return ca, cluster_key, token


async def _create_store(
    data: DataDir,
    config: ServerConfig,
    admin_token: str,
    ca_cert: bytes | None = None,
    *,
    only_if_new: bool = False,
) -> None:
    from llmgw.server.store import open_store

    ours = pki.fingerprint(ca_cert if ca_cert is not None else data.ca_cert.read_bytes())
    store = await open_store(config, data.root)
    try:
        if only_if_new:
            held = await store.get_setting("cluster.ca_fingerprint")
            if held == ours:
                return
            if held is not None:
                raise InitError(
                    f"the store holds another cluster (CA {held}, not {ours}): give the "
                    "keys of the cluster it holds, or a new store; nothing was changed"
                )
        await store.add_admin_token("initial", pki.token_hash(admin_token))
        await store.put_setting("cluster.ca_fingerprint", ours)
        await store.put_setting("ha.term", "1")
        await store.put_setting("ha.leader", config.ha.name or socket.gethostname())
        await store.audit("server init", "init", str(data.root))
    finally:
        await store.close()
