"""The MCP tool servers the gateway's ``/mcp`` reaches: what ``ctl mcp add`` keeps.

They are one JSON document in the store's settings (``"mcp"``), ``{"servers": [...]}``,
so every control plane reads the same and a standby takes a change when its copy of the
settings table changes (``ControlPlane.reload``). A credential header's value is kept
sealed with the cluster's key (``pki.seal``) as ``{"name": H, "sealed": "sealed1:..."}``,
opened in memory only to be sent, and shown back as ``{"name": H, "sealed": true}``:
never in an answer, a log line or an audit entry.

``llmgw:admin``, the built-in server, is always listed: it is answered in the control
plane's own process, so it has no address or credential; only whether it is on (and its
rate, timeout and description) is kept for it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from llmgw import pki
from llmgw.server.mcp.tools import ADMIN_SERVER
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store
from llmgw.wire.admin import McpHeaderJson

log = logging.getLogger("llmgw.mcp")

SETTING = "mcp"
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
NAME_DOC = "1-32 of a-z, 0-9, '_' and '-', beginning with a letter or digit"
# An HTTP header's name (RFC 9110's token), and a value with no line breaks in it.
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
HEADER_VALUE = re.compile(r"^[^\x00-\x08\x0a-\x1f\x7f]{0,4096}$")
# Headers that carry a credential: refused as plain --header (they go sealed).
CREDENTIAL_HEADERS = {"authorization", "proxy-authorization", "cookie"}
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 600.0
WHERE_CREDENTIALS_GO = "put the credential in --bearer-file or --secret-file"


def bad(field_name: str, message: str) -> Refusal:
    return Refusal(400, "bad_request", f"{field_name}: {message}", field_name)


@dataclass(frozen=True)
class Header:
    """A header sent with every request to a server: plain, or a sealed credential
    (``sealed`` holds its sealed form; ``value`` is open in memory only)."""

    name: str
    value: str = field(repr=False)
    sealed: str | None = field(default=None, repr=False)

    def shown(self) -> McpHeaderJson:
        if self.sealed is not None:
            return {"name": self.name, "sealed": True, "value": None}
        return {"name": self.name, "sealed": False, "value": self.value}


@dataclass(frozen=True)
class McpServer:
    """A tool server: its name (the ``SERVER`` of ``SERVER.TOOL``), its address, what is
    sent with each request, the whole call's timeout, each caller's calls a minute."""

    name: str
    url: str = ""
    headers: tuple[Header, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    rate: int | None = None
    description: str = ""
    enabled: bool = True
    updated_at: float | None = None
    updated_by: str | None = None

    @property
    def builtin(self) -> bool:
        return self.name == ADMIN_SERVER

    def sent_headers(self) -> dict[str, str]:
        return {h.name: h.value for h in self.headers}

    def document(self) -> dict[str, object]:
        """As the store keeps it (the credentials sealed)."""
        headers: list[dict[str, str]] = [
            {"name": h.name, "sealed": h.sealed} if h.sealed else {"name": h.name, "value": h.value}
            for h in self.headers
        ]
        return {
            "name": self.name,
            "url": self.url,
            "headers": headers,
            "timeout": self.timeout,
            "rate": self.rate,
            "description": self.description,
            "enabled": self.enabled,
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
        }

    @classmethod
    def read(cls, doc: dict[str, object], cluster_secret: bytes) -> McpServer:
        headers: list[Header] = []
        kept = doc.get("headers")
        for h in kept if isinstance(kept, list) else []:
            if not isinstance(h, dict) or not isinstance(h.get("name"), str):
                continue
            sealed = h.get("sealed")
            if isinstance(sealed, str):
                value = pki.unseal(cluster_secret, sealed).decode()
                headers.append(Header(h["name"], value, sealed))
            else:
                headers.append(Header(h["name"], str(h.get("value") or "")))
        timeout, rate, at = doc.get("timeout"), doc.get("rate"), doc.get("updated_at")
        by = doc.get("updated_by")
        return cls(
            name=str(doc["name"]),
            url=str(doc.get("url") or ""),
            headers=tuple(headers),
            timeout=float(timeout) if isinstance(timeout, int | float) else DEFAULT_TIMEOUT,
            rate=rate if isinstance(rate, int) and rate > 0 else None,
            description=str(doc.get("description") or ""),
            enabled=doc.get("enabled") is not False,
            updated_at=float(at) if isinstance(at, int | float) else None,
            updated_by=by if isinstance(by, str) else None,
        )


def checked_name(name: str) -> str:
    if name != ADMIN_SERVER and not NAME.match(name):
        raise bad("name", f"{name!r} is not a server name: {NAME_DOC}")
    return name


def checked_url(url: str) -> str:
    """An http(s) address with a host and no credential in it."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise bad("url", f"not an address ({exc})") from None
    if parts.username is not None or parts.password is not None:
        raise bad("url", f"the address holds a user or password: {WHERE_CREDENTIALS_GO}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad(
            "url",
            "give an http:// or https:// address with a host, such as "
            "https://tools.example.com/mcp",
        )
    if any(c in url for c in "\r\n\t "):
        raise bad("url", "the address holds spaces or line breaks")
    return url


def plain_header(text: str) -> Header:
    """``Name=value`` (``--header``), not a credential header."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not HEADER_NAME.match(name) or not HEADER_VALUE.match(value):
        raise bad("headers", f"{name or text[:20]!r}: give a header as NAME=VALUE, one line")
    if name.lower() in CREDENTIAL_HEADERS:
        raise bad("headers", f"{name} carries a credential: {WHERE_CREDENTIALS_GO}")
    return Header(name, value)


def secret_headers(text: str, cluster_secret: bytes) -> list[Header]:
    """The lines of a ``--secret-file``: ``Header-Name: value`` each, sealed. An error
    names the line, never what it holds."""
    found: list[Header] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not HEADER_NAME.match(name) or not value or not HEADER_VALUE.match(value):
            raise bad("secret", f"line {number} is not 'Header-Name: value'")
        found.append(Header(name, value, pki.seal(cluster_secret, value.encode())))
    if not found:
        raise bad("secret", "no 'Header-Name: value' line in it")
    return found


def bearer_header(token: str, cluster_secret: bytes) -> Header:
    token = token.strip()
    if not token or not HEADER_VALUE.match(token) or " " in token:
        raise bad("bearer", "the token file holds no token, or more than one line")
    value = f"Bearer {token}"
    return Header("Authorization", value, pki.seal(cluster_secret, value.encode()))


def merged(old: Sequence[Header], new: Sequence[Header]) -> tuple[Header, ...]:
    """``old`` with each of ``new`` in place of those of its name."""
    names = {h.name.lower() for h in new}
    return (*(h for h in old if h.name.lower() not in names), *new)


class McpRegistry:
    """The servers in memory, read from and written to the store."""

    def __init__(self, store: Store, cluster_secret: bytes) -> None:
        self.store = store
        self.secret = cluster_secret
        self.servers: dict[str, McpServer] = {ADMIN_SERVER: McpServer(ADMIN_SERVER)}
        # Entries of the document this control plane cannot read (a credential its key
        # does not open): not used, not shown, and written back as they are, never lost.
        self.unread: list[dict[str, object]] = []

    async def load(self) -> None:
        raw = await self.store.get_setting(SETTING)
        servers: dict[str, McpServer] = {ADMIN_SERVER: McpServer(ADMIN_SERVER)}
        unread: list[dict[str, object]] = []
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError as exc:
            log.warning("the MCP servers in the store are not JSON (%s); none is used", exc)
            doc = {}
        entries = doc.get("servers") if isinstance(doc, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            try:
                server = McpServer.read(entry, self.secret)
            except (ValueError, KeyError, TypeError, pki.PKIError) as exc:
                log.warning("the MCP server %s cannot be read (%s): not used", entry["name"], exc)
                unread.append(entry)
                continue
            servers[server.name] = server
        self.servers, self.unread = servers, unread

    async def write(self, servers: dict[str, McpServer]) -> None:
        names = set(servers)
        kept = [e for e in self.unread if e["name"] not in names]
        read = [s.document() for _, s in sorted(servers.items())]
        doc = {"servers": read + kept}
        await self.store.put_setting(SETTING, json.dumps(doc, sort_keys=True))
        self.servers = {ADMIN_SERVER: McpServer(ADMIN_SERVER), **servers}

    def get(self, name: str) -> McpServer | None:
        return self.servers.get(name)

    def put(self, server: McpServer) -> dict[str, McpServer]:
        return {**self.servers, server.name: server}

    def without(self, name: str) -> dict[str, McpServer]:
        return {n: s for n, s in self.servers.items() if n != name}

    def switched(self, name: str, enabled: bool) -> McpServer | None:
        server = self.servers.get(name)
        return None if server is None else replace(server, enabled=enabled)
