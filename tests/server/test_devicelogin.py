"""``llmgw login``'s codes (``people/devicelogin.py``) over a real directory and store:
a code is approved by a person alone, answers its token once, and ends after 10 minutes
or once used; a denied code answers no token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.server.people.asks import NewPerson
from llmgw.server.people.devicelogin import TTL, DeviceLogins, normal
from llmgw.server.people.directory import Directory
from llmgw.server.people.service import PeopleService
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import SQLiteStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def logins(tmp_path: Path) -> AsyncIterator[tuple[DeviceLogins, Principal, Clock]]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    directory = Directory(store)
    await directory.load()
    people = PeopleService(directory)
    ann = await people.create(NewPerson(login="ann"), Principal.system("test"))
    acting = directory.principal(ann, "session")
    assert acting is not None
    clock = Clock()
    try:
        yield DeviceLogins(people, directory, clock), acting, clock
    finally:
        await store.close()


def code_of(refused: pytest.ExceptionInfo[Refusal]) -> str:
    return refused.value.code


async def test_an_approved_code_answers_a_token_of_its_person_once(
    logins: tuple[DeviceLogins, Principal, Clock],
) -> None:
    service, ann, _ = logins
    code = service.start("llmgw ctl on laptop", "10.0.0.5")
    assert len(code.user_code) == 9 and code.user_code[4] == "-"
    with pytest.raises(Refusal) as refused:
        await service.token(code.device_code)
    assert code_of(refused) == "authorization_pending"
    # Typed as people type it: any case, no dash.
    shown = service.waiting(code.user_code.replace("-", "").lower())
    assert (shown.client, shown.address) == ("llmgw ctl on laptop", "10.0.0.5")
    service.approve(code.user_code, ann)
    record, token, login = await service.token(code.device_code)
    assert login == "ann" and token.startswith("llmgw-pat-")
    assert record.person_id == ann.person and record.name == "llmgw login: llmgw ctl on laptop"
    acting = service.directory.by_token(token)
    assert acting is not None and (acting.name, acting.person) == ("ann", ann.person)
    # Used: neither the token nor the page has it any more.
    with pytest.raises(Refusal) as refused:
        await service.token(code.device_code)
    assert code_of(refused) == "expired_token"
    with pytest.raises(Refusal):
        service.approve(code.user_code, ann)


async def test_a_code_ends_after_ten_minutes(
    logins: tuple[DeviceLogins, Principal, Clock],
) -> None:
    service, ann, clock = logins
    code = service.start("", "?")
    clock.now += TTL - 1
    assert service.waiting(code.user_code).client == "llmgw ctl"
    clock.now += 1
    with pytest.raises(Refusal) as refused:
        service.approve(code.user_code, ann)
    assert refused.value.status == 404 and "llmgw login` again" in refused.value.message
    with pytest.raises(Refusal) as refused:
        await service.token(code.device_code)
    assert code_of(refused) == "expired_token"


async def test_a_denied_code_answers_no_token_and_the_admin_token_approves_none(
    logins: tuple[DeviceLogins, Principal, Clock],
) -> None:
    service, ann, _ = logins
    code = service.start("ctl", "?")
    with pytest.raises(Refusal) as refused:
        service.approve(code.user_code, Principal("admin@10.0.0.1", "admin", "session"))
    assert refused.value.status == 403 and "only a person can approve" in refused.value.message
    service.approve(code.user_code, ann, yes=False)
    with pytest.raises(Refusal) as refused:
        await service.token(code.device_code)
    assert code_of(refused) == "access_denied"
    with pytest.raises(Refusal) as refused:
        await service.token(code.device_code)
    assert code_of(refused) == "expired_token"


def test_user_codes_are_read_as_typed() -> None:
    assert normal("bcdf-ghjk") == "BCDF-GHJK" == normal(" BCDFGHJK ")
    assert normal("bcd") == "BCD"
