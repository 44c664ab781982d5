"""Sign-in for the admin pages: signed session cookies, CSRF tokens, a limit on failures.

A session is a cookie the control plane signs with a key derived from the cluster
secret, so every control plane of the cluster (a standby too) honours it and nothing is
stored: ``base64url(json) "." base64url(HMAC-SHA256)``. It names who signed in, their
role, when it ends, a random id, and a binding to the admin token it was opened with:
when that token is rotated, its sessions end with it. Signing out ends the session here
at once (its id is kept, refused, until the session would have ended) and, through the
store, on every other control plane (``Revocations`` hands their ids to ``ended``).

Each session's CSRF token is an HMAC of its id: a form or an htmx request that changes
anything must carry it (field ``csrf`` or header ``X-CSRF-Token``). The cookie is
HttpOnly and SameSite=Strict on top of that, and Secure when the page came over TLS.

Failed sign-ins are counted per client address: past ``limit`` in ``window`` seconds,
the next is refused until the oldest ages out.

Signing out on every control plane (``Revocations``): ending a session on the one that
answered the sign-out is not enough, since the same cookie would still open pages on a
standby until it expired. So a sign-out is kept in the store's ``session_revocations``
(the session's id and when it would have ended) and every control plane refuses the ids
it holds:

- the leader writes the row, with its audit entry; a standby cannot write the store, so
  it sends the sign-out to the leader over the control planes' link (``/peer/signout``),
  as it does its usage;
- each control plane reads the list back when its store changes: a SQLite standby as
  the leader's changes reach it (a long poll, so within a round trip), a PostgreSQL
  one every second (``Follower``), and every control plane when it starts. A signed-out
  cookie is refused everywhere well within 2 s (``tests/e2e/test_sessions_ha.py``).

The session ends on the control plane that answered at once, before the store or the
leader has answered; when neither can be reached, the sign-out holds there (and the
browser's cookie is deleted), and the log says the others did not hear of it. Rows go
once their session would have ended (each sign-out removes those): the list holds at
most the sessions signed out within a session's lifetime, 12 hours.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from llmgw.server.principal import ROLES, Principal, Role, is_role
from llmgw.server.store import Audit, Store, StoreError

log = logging.getLogger("llmgw.pages")

COOKIE = "llmgw_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
DEFAULT_TTL = 12 * 3600.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _same(ours: str, theirs: str) -> bool:
    """Constant-time equality of what we made and what a client sent, which may hold any
    character (``compare_digest`` refuses non-ASCII text; bytes it takes)."""
    return hmac.compare_digest(ours.encode(), theirs.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Session:
    """Who is signed in: their name, role, the session's id and when it ends; for a
    person (signed in through the cluster's identity provider), their id, and who they
    act as now (``who``: the gate fills it in from the directory at every request)."""

    actor: str
    role: Role | None
    sid: str
    expires: float
    binding: str
    person: str | None = None
    who: Principal | None = None

    def may(self, role: Role) -> bool:
        """Whether this session's role reaches ``role``."""
        return self.principal.may(role)

    @property
    def principal(self) -> Principal:
        if self.who is not None:
            return self.who
        return Principal(self.actor, self.role, "session")


class Sessions:
    """Opens, reads and ends sessions, and makes their CSRF tokens."""

    def __init__(
        self,
        cluster_secret: bytes,
        admin_hashes: Callable[[], Iterable[str]],
        ttl: float = DEFAULT_TTL,
    ) -> None:
        self._key = hmac.new(cluster_secret, b"llmgw admin session v1", hashlib.sha256).digest()
        # The admin tokens' hashes now: a session bound to none of them has ended.
        self._admin_hashes = admin_hashes
        self.ttl = ttl
        self._ended: dict[str, float] = {}  # sid -> when it would have ended

    def _sign(self, body: bytes) -> str:
        return _b64(hmac.new(self._key, body, hashlib.sha256).digest())

    def _bind(self, token_hash: str) -> str:
        return _b64(hmac.new(self._key, b"bind:" + token_hash.encode(), hashlib.sha256).digest())[
            :22
        ]

    def open(self, actor: str, role: Role, token_hash: str, now: float | None = None) -> str:
        """A new session's cookie value, opened with the admin token (of that hash)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        return self._open({"a": actor, "r": role, "b": self._bind(token_hash)}, now)

    def open_person(self, login: str, person_id: str, now: float | None = None) -> str:
        """A person's session: their role is read from the directory at each request,
        so a changed role or a deactivation holds at once."""
        claims = {"a": login, "r": "", "p": person_id, "b": self._bind("person:" + person_id)}
        return self._open(claims, now)

    def _open(self, given: dict[str, str], now: float | None) -> str:
        now = time.time() if now is None else now
        claims = {**given, "s": secrets.token_urlsafe(12), "e": round(now + self.ttl)}
        body = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
        return f"{_b64(body)}.{self._sign(body)}"

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie holds, or None: unsigned, altered, ended or unbound."""
        if not cookie or cookie.count(".") != 1 or len(cookie) > 1024:
            return None
        body_text, signature = cookie.split(".")
        try:
            body = _unb64(body_text)
        except ValueError:
            return None
        if not _same(self._sign(body), signature):
            return None
        try:
            claims = json.loads(body)
            role = str(claims["r"])
            person = str(claims["p"]) if "p" in claims else None
            if not is_role(role) and (person is None or role):
                return None
            session = Session(
                actor=str(claims["a"]),
                role=role if is_role(role) else None,
                sid=str(claims["s"]),
                expires=float(claims["e"]),
                binding=str(claims["b"]),
                person=person,
            )
        except (ValueError, KeyError, TypeError):
            return None
        now = time.time() if now is None else now
        if now >= session.expires or session.sid in self._ended:
            return None
        if person is not None:
            return session if _same(self._bind("person:" + person), session.binding) else None
        if not any(_same(self._bind(h), session.binding) for h in self._admin_hashes()):
            return None
        return session

    def end(self, session: Session, now: float | None = None) -> None:
        """Sign out: the session is refused from now on, here."""
        self.ended({session.sid: session.expires}, now)

    def ended(self, sessions: Mapping[str, float], now: float | None = None) -> None:
        """Sessions signed out (here or elsewhere), each id with when it would have ended:
        refused from now on. Those that have ended by now are forgotten."""
        now = time.time() if now is None else now
        self._ended = {sid: t for sid, t in {**self._ended, **sessions}.items() if t > now}

    def csrf(self, session: Session) -> str:
        return self._sign(b"csrf:" + session.sid.encode())[:32]

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and _same(self.csrf(session), str(token))


@dataclass(frozen=True)
class SignOut:
    """A session ended before its time: its id, when it would have ended, and who (for
    the audit trail)."""

    sid: str
    expires: float
    actor: str


class Revocations:
    """Ends sessions on every control plane, through the store."""

    def __init__(
        self,
        sessions: Sessions,
        store: Store,
        leading: Callable[[], bool],
        to_leader: Callable[[SignOut], Awaitable[None]],
    ) -> None:
        self.sessions = sessions
        self.store = store
        self._leading = leading
        # A standby's way to the leader; raises ConnectionError when it cannot be told.
        self._to_leader = to_leader

    async def end(self, session: Session, actor: str) -> None:
        """Sign out: refused here now, and on every control plane once the store has it."""
        self.sessions.end(session)
        signed_out = SignOut(session.sid, session.expires, actor)
        try:
            if self._leading():
                await self.record(signed_out)
            else:
                await self._to_leader(signed_out)
        except (StoreError, ConnectionError) as exc:
            log.warning(
                "%s signed out here, but the other control planes were not told (%s): the "
                "session stays open there until it ends, within 12 hours",
                actor,
                exc,
            )

    async def record(self, signed_out: SignOut) -> None:
        """The leader: keep a sign-out (its own or a standby's) in the store."""
        now = time.time()
        self.sessions.ended({signed_out.sid: signed_out.expires}, now)
        audit = Audit(signed_out.actor, "admin.sign_out", "/admin")
        await self.store.revoke_session(signed_out.sid, signed_out.expires, now, audit)

    async def load(self) -> None:
        """Refuse every session the store says was signed out."""
        now = time.time()
        self.sessions.ended(await self.store.revoked_sessions(now), now)


class SignInLimiter:
    """At most ``limit`` failed sign-ins per address in ``window`` seconds."""

    def __init__(self, limit: int = 5, window: float = 300.0, addresses: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self._addresses = addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, address: str, now: float | None = None) -> float:
        """Seconds before ``address`` may try again; 0 when it may now."""
        now = time.time() if now is None else now
        failures = self._failures.get(address)
        if failures is None:
            return 0.0
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if len(failures) < self.limit:
            return 0.0
        return max(0.0, failures[0] + self.window - now)

    def failed(self, address: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        failures = self._failures.pop(address, None) or deque(maxlen=self.limit)
        failures.append(now)
        self._failures[address] = failures
        while len(self._failures) > self._addresses:
            self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)
