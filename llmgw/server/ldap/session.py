"""One conversation with the directory server, in the steps of a sign-in: connect, bind
as the service account, find the person, bind as them with their password (at sign-in;
``ctl auth ldap test`` may leave it out), and read their groups.

Blocking (ldap3 is synchronous): the service runs it in a worker thread with a limit
on the whole, and each socket operation has its own timeout. A step that fails raises
``StepFailed`` naming it, with what the directory said; the steps passed are appended to
the list the caller hands in as they pass, so a caller that stops waiting still knows
how far it got.

What a person types reaches a filter only escaped (RFC 4515), and an empty password is
refused before any bind: LDAP takes a simple bind with a DN and no password as an
anonymous bind and answers it with success.

Nested groups: Active Directory walks them itself (``LDAP_MATCHING_RULE_IN_CHAIN`` in
its default group filter); elsewhere ``walk_groups`` asks, level by level, which groups
hold the groups found so far, up to ``DEPTH`` levels and ``MOST_GROUPS`` groups, and
never asks of a group twice (a loop of groups ends).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import ldap3
from ldap3.core.exceptions import LDAPException

from llmgw.server.ldap.settings import DN, LdapSettings
from llmgw.server.ldap.steps import MOST_GROUPS, Found, Passed, StepFailed, fill, walk_groups
from llmgw.wire.admin.ldap import LdapStep

# Group DNs asked of in one search (an OR of their filters).
BATCH = 50
ATTRIBUTES = ["cn", "displayName", "mail"]


def _first(value: object) -> str:
    if isinstance(value, list | tuple):
        return str(value[0]) if value else ""
    return "" if value is None else str(value)


def _said(conn: ldap3.Connection) -> str:
    result = conn.result or {}
    words = str(result.get("description") or "no answer")
    message = str(result.get("message") or "").strip()
    return f"{words}: {message}" if message else words


class CheckedTls(ldap3.Tls):  # type: ignore[misc]
    """TLS that holds the server to a CA (the one given, else the system's) and to its
    name, by the standard library: ldap3's own check of the name calls
    ``ssl.match_hostname``, deprecated, and gone from Python 3.12."""

    def __init__(self, host: str, ca_pem: str | None) -> None:
        super().__init__(validate=ssl.CERT_REQUIRED)
        self.context = ssl.create_default_context(cadata=ca_pem)
        self.host = host

    def wrap_socket(self, connection: ldap3.Connection, do_handshake: bool = False) -> None:
        connection.socket = self.context.wrap_socket(
            connection.socket,
            server_side=False,
            do_handshake_on_connect=do_handshake,
            server_hostname=self.host,
        )


class DirectorySession:
    """The steps against one directory server, as its settings say."""

    def __init__(self, settings: LdapSettings, timeout: float = 5.0) -> None:
        self.settings = settings
        self.timeout = timeout
        host, port, tls = settings.host_port
        kept = CheckedTls(host, settings.ca_pem) if tls else None
        self.server = ldap3.Server(
            host,
            port=port,
            use_ssl=tls,
            tls=kept,
            get_info=ldap3.NONE,
            connect_timeout=timeout,
        )

    def _connection(self, user: str, password: str) -> ldap3.Connection:
        return ldap3.Connection(
            self.server,
            user=user,
            password=password,
            auto_bind=ldap3.AUTO_BIND_NONE,
            # Referrals would take the service account's password to another host.
            auto_referrals=False,
            read_only=True,
            # An int: ldap3 packs it into SO_RCVTIMEO as one.
            receive_timeout=max(1, round(self.timeout)),
            raise_exceptions=False,
        )

    def run(self, login: str, password: str | None, passed: list[Passed]) -> Found:
        """The steps for ``login``; ``password`` None leaves out their bind."""
        s = self.settings
        conn = self._connection(s.bind_dn, s.bind_password)
        try:
            try:
                conn.open()
            except LDAPException as exc:
                # ldap3 keeps the socket it failed to connect, open.
                sock = getattr(conn, "socket", None)
                if sock is not None:
                    sock.close()
                raise StepFailed("connect", f"cannot reach {s.url}: {exc}") from None
            passed.append(Passed("connect", s.url))
            try:
                bound = conn.bind()
            except LDAPException as exc:
                raise StepFailed("service_bind", f"binding as {s.bind_dn} failed: {exc}") from None
            if not bound:
                raise StepFailed(
                    "service_bind",
                    f"the directory refused the service account {s.bind_dn} ({_said(conn)}): "
                    "check --bind-dn and the password in --bind-password-file",
                )
            passed.append(Passed("service_bind", s.bind_dn))
            found = self._find(conn, login)
            passed.append(Passed("find", found.dn))
            if password is not None:
                self._person_bind(found.dn, password)
                passed.append(Passed("person_bind", found.dn))
            groups = self._groups(conn, login, found.dn)
            passed.append(Passed("groups", f"{len(groups)} group(s)"))
            return Found(found.dn, found.name, found.email, tuple(groups))
        finally:
            try:
                conn.unbind()
            except LDAPException:
                pass

    def _search(
        self, conn: ldap3.Connection, base: str, query: str, step: LdapStep
    ) -> list[dict[str, object]]:
        try:
            conn.search(
                base,
                query,
                ldap3.SUBTREE,
                attributes=ATTRIBUTES if step == "find" else [],
                size_limit=2 if step == "find" else MOST_GROUPS,
                time_limit=max(1, int(self.timeout)),
            )
        except LDAPException as exc:
            raise StepFailed(step, f"searching {base} for {query} failed: {exc}") from None
        result = conn.result or {}
        if result.get("result") == 32:  # noSuchObject
            raise StepFailed(step, f"{base} is not in the directory: check the base DN")
        if result.get("result") not in (0, 4):  # success, size limit exceeded
            raise StepFailed(step, f"searching {base} for {query}: {_said(conn)}")
        return [e for e in conn.response or [] if e.get("type") == "searchResEntry"]

    def _find(self, conn: ldap3.Connection, login: str) -> Found:
        s = self.settings
        query = fill(s.user_filter, login=login)
        entries = self._search(conn, s.base_dn, query, "find")
        if not entries:
            raise StepFailed("find", f"no one under {s.base_dn} matches {query}", refused=True)
        if len(entries) > 1:
            raise StepFailed(
                "find",
                f"more than one entry under {s.base_dn} matches {query}: narrow --user-filter",
                refused=True,
            )
        entry = entries[0]
        attrs = entry.get("attributes") or {}
        assert isinstance(attrs, Mapping)  # ldap3: a case-insensitive dict
        name = _first(attrs.get("displayName")) or _first(attrs.get("cn"))
        return Found(str(entry["dn"]), name, _first(attrs.get("mail")))

    def _person_bind(self, dn: str, password: str) -> None:
        if not password:
            # An empty password would be an anonymous bind, which succeeds.
            raise StepFailed("person_bind", "an empty password is refused", refused=True)
        conn = self._connection(dn, password)
        try:
            if not conn.bind():
                said = f"the directory refused {dn}'s password ({_said(conn)})"
                raise StepFailed("person_bind", said, refused=True)
        except LDAPException as exc:
            raise StepFailed("person_bind", f"binding as {dn} failed: {exc}") from None
        finally:
            try:
                conn.unbind()
            except LDAPException:
                pass

    def _groups(self, conn: ldap3.Connection, login: str, dn: str) -> list[str]:
        s = self.settings
        base = s.group_base
        direct = [
            str(e["dn"])
            for e in self._search(conn, base, fill(s.group_filter, login, dn), "groups")
        ]
        if s.ad or DN not in s.group_filter:
            # AD's rule in chain already gave the nested ones; a filter of {login} alone
            # (posixGroup's memberUid) names no group by DN to walk up from.
            return direct[:MOST_GROUPS]

        def holders(dns: list[str]) -> list[str]:
            out: list[str] = []
            for i in range(0, len(dns), BATCH):
                either = "".join(fill(s.group_filter, login, g) for g in dns[i : i + BATCH])
                out += [str(e["dn"]) for e in self._search(conn, base, f"(|{either})", "groups")]
            return out

        return walk_groups(direct, holders)
