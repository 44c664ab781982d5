"""LDAP / Active Directory sign-in as a service: its settings (the cluster's admins set,
show and turn them off), ``test`` (the steps of a sign-in tried from this control plane,
saying which failed and what it found) and ``sign_in`` (a person's login and password:
found with the service account, bound as themselves, their groups read, then made or
updated by ``PeopleService.sign_in``, the one way an identity provider does).

Every control plane reads the settings from the store when it needs them, so a change
on the leader holds on a standby as soon as its copy of the store has it. The service
account's password is sealed there and never leaves this module: not in an answer, an
audit entry or a log line.

A person is told "wrong login or password" alike for an unknown login, a wrong
password and an empty one (which LDAP would take as an anonymous bind); the admin's
``test`` says which it was.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

from llmgw import pki
from llmgw.server.ldap.settings import (
    AD_GROUP_FILTER,
    AD_USER_FILTER,
    DN,
    GROUP_FILTER,
    LOGIN,
    SETTING,
    USER_FILTER,
    LdapSet,
    LdapSettings,
    checked_dn,
    checked_filter,
    checked_url,
    map_json,
    matching,
    parse_map,
)
from llmgw.server.ldap.steps import Found, Passed, StepFailed
from llmgw.server.people.records import Person
from llmgw.server.people.service import Identity, PeopleService
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.schema import spec
from llmgw.server.store import Store
from llmgw.wire.admin.ldap import LdapSettingsJson, LdapStep, LdapStepJson, LdapTestJson

log = logging.getLogger("llmgw.ldap")

STEPS: tuple[LdapStep, ...] = get_args(LdapStep)
# What a person may type as a login: no control characters, not too long.
TYPED_LOGIN = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
WRONG = "wrong login or password"
# The codes a refused sign-in carries, for the pages to say it in the person's language.
WRONG_CODE, DEACTIVATED_CODE, UNAVAILABLE_CODE, OFF_CODE, FIRST_ON_LEADER_CODE = (
    "wrong_login_or_password",
    "deactivated",
    "directory_unavailable",
    "ldap_off",
    "first_on_leader",
)


@dataclass(frozen=True)
class LdapTest:
    """Try LDAP sign-in for a login from the control plane, step by step."""

    login: str = spec(doc="the login to find", min_length=1, max_length=256)
    password: str | None = spec(
        None, doc="their password, to try their bind too (never kept)", max_length=1024
    )


def _refuse_admin(by: Principal) -> None:
    if not by.may("admin"):
        raise Refusal(403, "forbidden", "sign-in settings need the cluster's admin role")


class LdapService:
    def __init__(
        self,
        store: Store,
        people: PeopleService,
        cluster_secret: bytes,
        leading: Callable[[], bool] = lambda: True,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``leading``: whether this control plane writes the store (a standby's sign-in
        writes nothing); ``timeout``: each socket operation's, a whole sign-in gets a few
        times it."""
        self.store = store
        self.leading = leading
        self.people = people
        self.directory = people.directory
        self.cluster_secret = cluster_secret
        self.timeout = timeout
        self.clock = clock

    async def current(self) -> LdapSettings | None:
        """The settings as the store has them now; None when LDAP is off (or what is
        kept does not open with this cluster's key, which the log says)."""
        raw = await self.store.get_setting(SETTING)
        try:
            return LdapSettings.from_store(raw, self.cluster_secret)
        except (pki.PKIError, ValueError, KeyError, TypeError) as exc:
            log.warning("the LDAP settings in the store cannot be read (%s); LDAP is off", exc)
            return None

    async def enabled(self) -> bool:
        """Whether the pages' sign-in offers a login and password."""
        return await self.current() is not None

    # ---------------------------------------------------------------- settings

    def _shown(self, s: LdapSettings | None) -> LdapSettingsJson:
        if s is None:
            return {
                "enabled": False,
                "url": None,
                "bind_dn": None,
                "bind_password": None,
                "base_dn": None,
                "user_filter": None,
                "group_base": None,
                "group_filter": None,
                "ad": False,
                "ca": None,
                "maps": [],
                "updated_at": None,
                "updated_by": None,
            }
        return {
            "enabled": True,
            "url": s.url,
            "bind_dn": s.bind_dn,
            "bind_password": "set",
            "base_dn": s.base_dn,
            "user_filter": s.user_filter,
            "group_base": s.group_base,
            "group_filter": s.group_filter,
            "ad": s.ad,
            "ca": "set" if s.ca_pem else None,
            "maps": [map_json(m, self.directory) for m in s.maps],
            "updated_at": s.updated_at,
            "updated_by": s.updated_by,
        }

    async def shown(self, by: Principal) -> LdapSettingsJson:
        """The settings without their secret: the password only as "set"."""
        _refuse_admin(by)
        return self._shown(await self.current())

    async def set(self, ask: LdapSet, by: Principal) -> LdapSettingsJson:
        """Check and keep new settings (every field named in a refusal); a password left
        out keeps the one kept."""
        _refuse_admin(by)
        password = ask.bind_password
        if password is None:
            kept = await self.current()
            if kept is None:
                raise Refusal(
                    400,
                    "bad_request",
                    "bind_password: give the service account's password",
                    "bind_password",
                )
            password = kept.bind_password
        base = checked_dn("base_dn", ask.base_dn)
        user_filter = ask.user_filter or (AD_USER_FILTER if ask.ad else USER_FILTER)
        group_filter = ask.group_filter or (AD_GROUP_FILTER if ask.ad else GROUP_FILTER)
        ca = (ask.ca_pem or "").strip() or None
        if ca is not None:
            try:
                ssl.create_default_context(cadata=ca)
            except (ssl.SSLError, ValueError) as exc:
                raise Refusal(
                    400, "bad_request", f"ca_pem: not PEM certificates ({exc})", "ca_pem"
                ) from None
        settings = LdapSettings(
            url=checked_url(ask.url),
            bind_dn=checked_dn("bind_dn", ask.bind_dn),
            bind_password=password,
            base_dn=base,
            user_filter=checked_filter("user_filter", user_filter, [LOGIN]),
            group_base=checked_dn("group_base", ask.group_base) if ask.group_base else base,
            group_filter=checked_filter("group_filter", group_filter, [DN, LOGIN]),
            ad=ask.ad,
            ca_pem=ca,
            maps=tuple(parse_map(m, self.directory) for m in ask.maps),
            updated_at=self.clock(),
            updated_by=by.name,
        )
        if settings.ca_pem and not settings.url.startswith("ldaps:"):
            raise Refusal(400, "bad_request", "ca_pem: a CA is for ldaps:// only", "ca_pem")
        await self.store.put_setting(SETTING, settings.to_store(self.cluster_secret))
        detail = f"{settings.url} as {settings.bind_dn}, {len(settings.maps)} map(s)"
        await self.store.audit(by.name, "auth.ldap.set", SETTING, detail)
        return self._shown(settings)

    async def off(self, by: Principal) -> LdapSettingsJson:
        """No more LDAP sign-in; the settings and their sealed password go."""
        _refuse_admin(by)
        await self.store.put_setting(SETTING, "")
        await self.store.audit(by.name, "auth.ldap.off", SETTING, "")
        return self._shown(None)

    # ------------------------------------------------------------ the directory

    async def _run(
        self, s: LdapSettings, login: str, password: str | None
    ) -> tuple[Found | None, list[Passed], StepFailed | None]:
        """The steps in a worker thread, given a few times the socket timeout in all."""
        # ldap3 is loaded the first time a directory is asked, never by a control plane
        # without LDAP set up.
        from llmgw.server.ldap.session import DirectorySession

        passed: list[Passed] = []
        session = DirectorySession(s, self.timeout)
        whole = self.timeout * 4 + 2
        try:
            async with asyncio.timeout(whole):
                found = await asyncio.to_thread(session.run, login, password, passed)
            return found, passed, None
        except StepFailed as exc:
            return None, list(passed), exc
        except TimeoutError:
            done = {p.step for p in passed}
            left = [st for st in STEPS if st not in done]
            if password is None:
                left = [st for st in left if st != "person_bind"]
            step = left[0] if left else "groups"
            return None, list(passed), StepFailed(step, f"no answer within {whole:g} s")

    async def test(self, ask: LdapTest, by: Principal) -> LdapTestJson:
        """The steps of a sign-in for ``ask.login`` against the settings kept, tried from
        this control plane: which passed, which failed and why, and what was found."""
        _refuse_admin(by)
        s = await self.current()
        if s is None:
            raise Refusal(404, OFF_CODE, "LDAP sign-in is off: `llmgw ctl auth ldap set` first")
        found, passed, failed = await self._run(s, ask.login.strip(), ask.password)
        steps: list[LdapStepJson] = [
            {"step": p.step, "ok": True, "detail": p.detail} for p in passed
        ]
        if failed is not None:
            steps.append({"step": failed.step, "ok": False, "detail": failed.message})
        maps = matching(found.groups, s.maps, self.directory) if found else []
        return {
            "ok": failed is None,
            "failed": None if failed is None else failed.step,
            "message": "every step passed" if failed is None else failed.message,
            "steps": steps,
            "person": None
            if found is None
            else {"dn": found.dn, "name": found.name, "email": found.email},
            "groups": list(found.groups) if found else [],
            "grants": [map_json(m, self.directory) for m in maps],
        }

    async def sign_in(self, login: str, password: str) -> Person:
        """The person a login and password are, made or updated from the directory;
        a Refusal (``WRONG_CODE``, ``DEACTIVATED_CODE``, ``UNAVAILABLE_CODE``,
        ``OFF_CODE``) otherwise."""
        s = await self.current()
        if s is None:
            raise Refusal(404, OFF_CODE, "LDAP sign-in is off")
        login = login.strip()
        if not TYPED_LOGIN.fullmatch(login) or not password:
            raise Refusal(401, WRONG_CODE, WRONG)
        found, _, failed = await self._run(s, login, password)
        if failed is not None or found is None:
            step = failed.step if failed else "find"
            why = failed.message if failed else "nothing found"
            if failed is not None and failed.refused:
                log.info("LDAP sign-in as %r refused at %s: %s", login, step, why)
                raise Refusal(401, WRONG_CODE, WRONG)
            # The directory, or its settings, not the person: the admins' to mend.
            log.warning("LDAP sign-in as %r failed at %s: %s", login, step, why)
            raise Refusal(
                503, UNAVAILABLE_CODE, "the directory cannot be asked now; try again later"
            )
        if not self.leading():
            return self._on_standby(found)
        maps = matching(found.groups, s.maps, self.directory)
        who = Identity("ldap", found.dn, login.lower(), found.name, found.email)
        person = await self.people.sign_in(who, [m.grant() for m in maps], login.lower())
        if person is None:
            raise Refusal(403, DEACTIVATED_CODE, "this account is deactivated; ask an admin")
        return person

    def _on_standby(self, found: Found) -> Person:
        """A standby writes nothing to the store (its copy follows the leader's): a
        person it knows signs in as they are, their groups applied at their next sign-in
        on the leader; someone new makes their account there first."""
        person = self.directory.by_subject(found.dn)
        if person is None:
            raise Refusal(
                409,
                FIRST_ON_LEADER_CODE,
                "this control plane is a standby: sign in on the leader once, to make your account",
            )
        if not person.active:
            raise Refusal(403, DEACTIVATED_CODE, "this account is deactivated; ask an admin")
        return person
