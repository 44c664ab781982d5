"""``llmgw login``'s device flow (after RFC 8628): ctl signs a person in through the pages.

1. ctl asks for a code (``start``, a public route): it gets a long secret
   ``device_code`` to poll with and a short ``user_code`` the person sees;
2. the person opens the pages' ``/admin/device?code=USER_CODE``, signed in as
   themselves, checks that the code and the client are the ones in their terminal, and
   approves (a POST, with the page's CSRF token) or denies;
3. ctl polls (``token``) with its device code: ``authorization_pending`` until then;
   once approved, a personal token made for that person, acting as them
   (``PeopleService.new_token``), answered once; the code ends with it.

Codes are single-use, end ``TTL`` seconds after they were made, and live in this
control plane's memory alone: ctl starts, polls, and the person approves on the same
control plane (the leader: the token is a write), and a restart forgets codes waiting.
At most ``MAX_WAITING`` wait at once, so a public route cannot fill the memory.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from llmgw.server.people.asks import NewToken
from llmgw.server.people.directory import Directory
from llmgw.server.people.records import PersonToken
from llmgw.server.people.service import PeopleService, refuse
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.schema import spec

TTL = 600.0
# Seconds ctl waits between polls.
INTERVAL = 2
MAX_WAITING = 1000
# A user code: 8 letters with no vowels (no words) and none that look alike, XXXX-XXXX.
ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
TOKEN_DAYS = 90
NO_SUCH_CODE = "no such code, or it has ended (each lasts 10 minutes); run `llmgw login` again"


@dataclass(frozen=True)
class DeviceCode:
    device_code: str
    user_code: str
    # What asked: the client's words (its host) and the address it came from.
    client: str
    address: str
    expires: float
    # Who approved it (a person's id); denied: the person said no.
    person: str | None = None
    denied: bool = False


def normal(user_code: str) -> str:
    """A user code as typed (any case, with or without its dash) as it is kept."""
    letters = "".join(c for c in user_code.upper() if c.isalnum())
    return f"{letters[:4]}-{letters[4:]}" if len(letters) == 8 else letters


class DeviceLogins:
    def __init__(
        self,
        people: PeopleService,
        directory: Directory,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.people = people
        self.directory = directory
        self.clock = clock
        self._by_device: dict[str, DeviceCode] = {}
        self._by_user: dict[str, str] = {}  # user code -> device code

    def _sweep(self) -> None:
        now = self.clock()
        for code in [c for c in self._by_device.values() if c.expires <= now]:
            self._end(code)

    def _end(self, code: DeviceCode) -> None:
        self._by_device.pop(code.device_code, None)
        self._by_user.pop(code.user_code, None)

    def start(self, client: str, address: str) -> DeviceCode:
        self._sweep()
        if len(self._by_device) >= MAX_WAITING:
            raise Refusal(429, "too_many", "too many sign-ins are waiting; try again shortly")
        user_code = ""
        while not user_code or user_code in self._by_user:
            letters = "".join(secrets.choice(ALPHABET) for _ in range(8))
            user_code = normal(letters)
        code = DeviceCode(
            device_code=secrets.token_urlsafe(32),
            user_code=user_code,
            client=client.strip()[:100] or "llmgw ctl",
            address=address,
            expires=self.clock() + TTL,
        )
        self._by_device[code.device_code] = code
        self._by_user[code.user_code] = code.device_code
        return code

    def waiting(self, user_code: str) -> DeviceCode:
        """The code a person is about to approve; 404 when there is none (or it ended)."""
        self._sweep()
        device = self._by_user.get(normal(user_code))
        code = self._by_device.get(device or "")
        if code is None or code.person is not None or code.denied:
            raise Refusal(404, "not_found", NO_SUCH_CODE)
        return code

    def approve(self, user_code: str, by: Principal, yes: bool = True) -> DeviceCode:
        """The signed-in person says yes (or no) to a waiting code: only a person, since
        the token ctl gets acts as them."""
        if by.person is None:
            raise refuse(
                "only a person can approve a sign-in: sign in to the pages as yourself, not "
                "with the admin token"
            )
        code = self.waiting(user_code)
        done = replace(code, person=by.person) if yes else replace(code, denied=True)
        self._by_device[code.device_code] = done
        return done

    async def token(self, device_code: str) -> tuple[PersonToken, str, str]:
        """The personal token of an approved code (record, token, login), once; else the
        RFC's answers: ``authorization_pending``, ``access_denied``, ``expired_token``."""
        self._sweep()
        code = self._by_device.get(device_code)
        if code is None:
            raise Refusal(400, "expired_token", NO_SUCH_CODE)
        if code.denied:
            self._end(code)
            raise Refusal(400, "access_denied", "the person said no to this sign-in")
        if code.person is None:
            raise Refusal(
                400, "authorization_pending", "waiting for the person to approve it on the pages"
            )
        self._end(code)  # single use: gone before the token is made
        acting = self.directory.session_principal(code.person)
        if acting is None:
            raise refuse("the person who approved this sign-in is deactivated")
        ask = NewToken(name=f"llmgw login: {code.client}"[:64], days=TOKEN_DAYS)
        record, token = await self.people.new_token(code.person, ask, acting)
        return record, token, acting.name


@dataclass(frozen=True)
class DeviceAsk:
    """A sign-in for ctl, to be approved on the pages."""

    client: str = spec(
        "", doc="what asks, shown to the person approving (ctl on HOST)", max_length=100
    )


@dataclass(frozen=True)
class DevicePoll:
    device_code: str = spec(
        doc="the code ``POST /api/v1/login/device`` answered", min_length=1, max_length=128
    )
