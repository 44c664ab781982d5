"""The control planes' link: mutual TLS on ``ha.peer_port``, HTTP/1.1, JSON.

Only control planes of the cluster get in: the other end's certificate must be signed by
the cluster CA, be named ``llmgw-server:NAME`` (no node's certificate can be) and carry
the serial the store holds for that control plane, which ``server remove`` retires.

What goes over it, always asked by a standby of its leader:

- ``GET /peer/state``: who this one is, its role, its term and its leader, and each
  rate-limited key's requests and tokens of the last minute here (limits are the
  cluster's: every control plane adds the others' counts to its own);
- ``GET /peer/snapshot``: a consistent copy of the store, with the change it ends at;
- ``GET /peer/changes?after=SEQ&wait=S``: the store's changes after SEQ, waiting up to
  S seconds for one (410 when they were pruned: take a snapshot again);
- ``GET /peer/fleet``: which replicas run Ready where, as the leader's agents say;
- ``POST /peer/usage``: requests and tokens counted on a standby, for the store;
- ``POST /peer/audit``: a standby's audit entries of tool calls and guard decisions;
- ``POST /peer/demand``: on-demand models a standby was asked for, for the leader's
  catalog to start or keep up (``demand.py``);
- ``POST /peer/signout``: an admin page session signed out on a standby, for the store
  (so every control plane refuses it);
- ``POST /peer/promote``: asked by ``llmgw server promote`` on the same machine, with
  that control plane's own certificate;
- ``POST /peer/restart``: asked by the control plane running ``llmgw restart``: this one
  answers, then starts again in place (``ControlPlane.relaunch``);
- ``POST /peer/upgrade``: asked by the leader of a standby during ``llmgw ctl upgrade``
  (``{version, source}``): it fetches and checks the release itself, answers, and starts
  again on it (``server/upgrade/service.py``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, NotRequired, Protocol, TypedDict

import aiohttp
from aiohttp import web

from llmgw import pki
from llmgw.config import format_hostport, parse_hostport
from llmgw.jsonvalue import JSON
from llmgw.server.ha.sqlitesync import ChangeJSON

log = logging.getLogger("llmgw.ha")

# A snapshot or a batch of changes is read within this.
TIMEOUT = 30.0
# The longest a standby may ask the leader to hold a request for changes.
MAX_WAIT = 5.0


Role = Literal["leader", "standby"]
# Who leads, as far as one control plane knows: its name (None when unknown) and its
# addresses (api_address, agent_address, peer_address; at least the last).
LeaderInfo = dict[str, str | None]


class PeerState(TypedDict):
    """A control plane as it says itself (``/peer/state``, ``/api/v1/leader``)."""

    name: str
    role: Role
    term: int
    leader: LeaderInfo | None
    problem: str | None
    lag_seconds: float | None
    last_contact: float | None
    # The llmgw it runs (``llmgw version --cluster``, and an upgrade's standbys).
    version: str
    # When this process started (epoch seconds): a later one after ``/peer/restart``.
    started: float


class ChangesAnswer(TypedDict):
    """``/peer/changes``: the leader's changes after the seq asked."""

    term: int
    leader: str
    seq: int
    changes: list[ChangeJSON]


class PromoteAnswer(TypedDict):
    """``/peer/promote``, and ``server promote``'s own when the control plane is down."""

    name: str
    role: Role
    term: int
    offline: NotRequired[bool]


class Behind(Exception):
    """The changes asked for were pruned: a new snapshot is needed."""


class Refused(Exception):
    """Asked what this control plane will not do (409): its words say why."""


class NotLeading(Refused):
    """Asked of a control plane that does not lead: its words say who does."""


class PeerHost(Protocol):
    """What the link serves, from the control plane it runs in."""

    name: str

    def state(self) -> PeerState: ...

    def peer_ok(self, name: str, serial: int) -> bool: ...

    def key_counts(self) -> dict[str, list[int]]: ...

    async def snapshot(self, dest: Path) -> int: ...

    async def changes(self, after: int, wait: float) -> ChangesAnswer: ...

    def fleet(self) -> list[dict[str, object]]: ...

    async def usage(self, rows: list[list[JSON]], sender: str) -> None: ...

    async def audit(self, rows: list[JSON], sender: str) -> None: ...

    def demand(self, models: dict[str, bool], sender: str) -> None: ...

    async def sign_out(self, sid: str, expires: float, actor: str) -> None: ...

    async def promote(self, force: bool) -> PromoteAnswer: ...


def read_demand(body: JSON) -> dict[str, bool]:
    """``/peer/demand``'s body, ``{"models": {NAME: START}}``; ValueError when it is not."""
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, dict) or not all(
        isinstance(k, str) and isinstance(v, bool) for k, v in models.items()
    ):
        raise ValueError('demand is {"models": {NAME: true or false}}')
    return {str(k): bool(v) for k, v in models.items()}


def _peer(request: web.Request) -> tuple[str, int] | None:
    """The other end's control plane name and certificate serial, from its certificate."""
    transport = request.transport
    found = pki.identity(transport.get_extra_info("peercert") if transport else None)
    name = pki.peer_name(found[0]) if found else None
    if found is None or name is None:
        return None
    return name, found[1]


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status)


# ``POST /peer/upgrade``'s work: (version, source) -> its answer; raises ValueError (400)
# or Refused (409) with words.
PeerUpgrade = Callable[[str, str], Awaitable[JSON]]


def peer_app(
    host: PeerHost,
    relaunch: Callable[[str], None] | None = None,
    upgrade: PeerUpgrade | None = None,
) -> web.Application:
    @web.middleware
    async def gate(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        who = _peer(request)
        if who is None or not host.peer_ok(*who):
            return _error(403, "forbidden", f"{who}: not a current control plane of this cluster")
        request["peer"] = who[0]
        try:
            return await handler(request)
        except NotLeading as exc:
            return _error(409, "not_leader", str(exc))
        except Refused as exc:
            return _error(409, "refused", str(exc))

    async def state(request: web.Request) -> web.Response:
        # To another control plane: also each limited key's last minute here.
        return web.json_response({**host.state(), "key_counts": host.key_counts()})

    async def snapshot(request: web.Request) -> web.StreamResponse:
        with tempfile.TemporaryDirectory(prefix="llmgw-snapshot-") as tmp:
            dest = Path(tmp) / "store.db"
            seq = await host.snapshot(dest)
            data = await asyncio.to_thread(dest.read_bytes)
        state = host.state()
        return web.Response(
            body=data,
            content_type="application/octet-stream",
            headers={"llmgw-seq": str(seq), "llmgw-term": str(state["term"])},
        )

    async def changes(request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after", "0"))
            wait = min(MAX_WAIT, max(0.0, float(request.query.get("wait", "0"))))
        except ValueError:
            return _error(400, "bad_request", "after is a change number, wait seconds")
        try:
            return web.json_response(await host.changes(after, wait))
        except Behind as exc:
            return _error(410, "behind", str(exc))

    async def fleet(request: web.Request) -> web.Response:
        return web.json_response(host.fleet())

    async def usage(request: web.Request) -> web.Response:
        rows = await request.json()
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            return _error(400, "bad_request", "usage is a list of rows")
        await host.usage(rows, request["peer"])
        return web.json_response({"rows": len(rows)})

    async def audit(request: web.Request) -> web.Response:
        rows = await request.json()
        if not isinstance(rows, list):
            return _error(400, "bad_request", "audit is a list of entries")
        try:
            await host.audit(rows, request["peer"])
        except ValueError as exc:
            return _error(400, "bad_request", str(exc))
        return web.json_response({"entries": len(rows)})

    async def demand(request: web.Request) -> web.Response:
        try:
            models = read_demand(await request.json())
        except ValueError as exc:
            return _error(400, "bad_request", str(exc))
        host.demand(models, request["peer"])
        return web.json_response({"models": len(models)})

    async def sign_out(request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body, dict):
            return _error(400, "bad_request", "a sign-out is an object")
        sid, expires, actor = body.get("sid"), body.get("expires"), body.get("actor")
        if not isinstance(sid, str) or not sid or len(sid) > 64 or not isinstance(actor, str):
            return _error(400, "bad_request", "a sign-out names the session (sid) and actor")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            return _error(400, "bad_request", "a sign-out says when its session ends (expires)")
        await host.sign_out(sid, float(expires), f"{actor[:200]} via {request['peer']}")
        return web.json_response({"sid": sid})

    async def promote(request: web.Request) -> web.Response:
        if request["peer"] != host.name:
            return _error(403, "forbidden", "only this control plane's own certificate promotes it")
        body = await request.json()
        return web.json_response(await host.promote(bool(body.get("force"))))

    async def upgrade_here(request: web.Request) -> web.Response:
        body = await request.json()
        version = body.get("version") if isinstance(body, dict) else None
        source = body.get("source") if isinstance(body, dict) else None
        if not isinstance(version, str) or not isinstance(source, str):
            return _error(400, "bad_request", "an upgrade names a version and a source")
        if upgrade is None:
            return _error(409, "refused", "this control plane does not take upgrades")
        try:
            return web.json_response(await upgrade(version, source))
        except ValueError as exc:
            return _error(400, "bad_request", str(exc))

    async def restart(request: web.Request) -> web.Response:
        if relaunch is None:
            return _error(409, "refused", f"{host.name} cannot start again in place")
        log.info("asked to start again in place by %s (llmgw restart)", request["peer"])
        # After this answer is on its way: the listener closes as the relaunch stops.
        asyncio.get_running_loop().call_soon(relaunch, f"llmgw restart, via {request['peer']}")
        return web.json_response({"name": host.name, "restarting": True})

    app = web.Application(middlewares=[gate], client_max_size=64 << 20)
    app.router.add_get("/peer/state", state)
    app.router.add_get("/peer/snapshot", snapshot)
    app.router.add_get("/peer/changes", changes)
    app.router.add_get("/peer/fleet", fleet)
    app.router.add_post("/peer/usage", usage)
    app.router.add_post("/peer/audit", audit)
    app.router.add_post("/peer/demand", demand)
    app.router.add_post("/peer/signout", sign_out)
    app.router.add_post("/peer/promote", promote)
    app.router.add_post("/peer/upgrade", upgrade_here)
    app.router.add_post("/peer/restart", restart)
    return app


class PeerListener:
    def __init__(
        self,
        host: PeerHost,
        tls: ssl.SSLContext,
        bind: str,
        port: int,
        *,
        relaunch: Callable[[str], None] | None = None,
        upgrade: PeerUpgrade | None = None,
    ) -> None:
        self.runner = web.AppRunner(
            peer_app(host, relaunch=relaunch, upgrade=upgrade), access_log=None
        )
        self.tls = tls
        self.bind = bind
        self.port = port

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.bind, self.port, ssl_context=self.tls)
        await site.start()

    async def stop(self) -> None:
        await self.runner.cleanup()


class PeerError(Exception):
    """The other control plane could not be asked, or refused: in words."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PeerClient:
    """This control plane asking another over the link."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self.tls = tls
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.tls, limit=8),
                timeout=aiohttp.ClientTimeout(total=TIMEOUT, connect=3),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, address: str, path: str) -> str:
        host, port = parse_hostport(address)
        return f"https://{format_hostport(host, port)}{path}"

    async def _call(
        self,
        method: str,
        address: str,
        path: str,
        body: object = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        try:
            async with self.session.request(
                method,
                self._url(address, path),
                json=body,
                params=params,
                timeout=aiohttp.ClientTimeout(total=timeout) if timeout else None,
            ) as resp:
                data = await resp.read()
                return resp.status, data, dict(resp.headers)
        except aiohttp.ClientConnectorCertificateError as exc:
            raise PeerError(
                f"{address}: its certificate is not trusted: {exc.certificate_error}"
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise PeerError(f"{address}: cannot ask it: {exc or type(exc).__name__}") from None

    async def json(
        self,
        method: str,
        address: str,
        path: str,
        body: object = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> JSON:
        """The other control plane's answer as JSON (None when empty), or PeerError."""
        import json

        status, data, _ = await self._call(method, address, path, body, params, timeout)
        answer: JSON
        try:
            answer = json.loads(data) if data else None
        except ValueError:
            answer = None
        if status != 200:
            error = answer.get("error") if isinstance(answer, dict) else None
            message = (
                error["message"] if isinstance(error, dict) else data[:200].decode(errors="replace")
            )
            raise PeerError(f"{address}: {message} (HTTP {status})", status)
        return answer

    async def snapshot(self, address: str, dest: Path) -> tuple[int, int]:
        """The leader's store written to ``dest``; returns (its last change, its term)."""
        status, data, headers = await self._call("GET", address, "/peer/snapshot", timeout=120)
        if status != 200:
            raise PeerError(f"{address}: no snapshot (HTTP {status}): {data[:200]!r}", status)
        await asyncio.to_thread(dest.write_bytes, data)
        return int(headers.get("llmgw-seq", "0")), int(headers.get("llmgw-term", "0"))
