"""Limits at every level a key is under: its own, its project's, team's and
organisation's. The tightest wins, for plain and streamed answers alike, whichever level
it is; a model is used only when every level that names models allows it; budgets and
minutes are their keys' summed, here and as heard from the other control planes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.config import GatewayConfig
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway import Gateway, key_hash
from llmgw.server.gateway.limits import Key, KeyBook, Usage
from llmgw.server.people.directory import Snapshot
from llmgw.server.people.records import Limits, Org, Project, Team
from llmgw.server.store import ApiKeyRecord, SQLiteStore
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support.fakeengine import FakeEngine
from tests.support.gatewayserve import served

KEY = "sk-llmgw-levels"
OTHER = "sk-llmgw-levels-other"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
LEVELS = ("key", "project", "team", "org")
NONE = Limits()
# How a refusal names each level.
NAMED = {
    "key": "this key",
    "project": "project vision/demo",
    "team": "team vision",
    "org": "organisation acme",
}


def tree(**limits: Limits) -> Snapshot:
    """acme > vision > demo, with the limits given by level (org, team, project)."""
    return Snapshot(
        orgs={"o1": Org("o1", "acme", limits.get("org", Limits()))},
        teams={"t1": Team("t1", "o1", "vision", limits.get("team", Limits()))},
        projects={"p1": Project("p1", "o1", "t1", "demo", limits.get("project", Limits()))},
    )


def record(key_id: str, secret: str, limits: Limits = NONE, **whose: str) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id,
        key_id,
        key_hash(secret),
        models=limits.models,
        rpm=limits.rpm,
        tpm=limits.tpm,
        budget=limits.budget,
        **({"org_id": "o1", "project_id": "p1"} | whose),  # type: ignore[arg-type]
    )


def at_each(tightest: str, field: str, value: int, loose: int) -> dict[str, Limits]:
    """Every level limited: ``tightest`` to ``value``, the others to ``loose``."""
    out: dict[str, Limits] = {}
    for level in LEVELS:
        limit = value if level == tightest else loose
        out[level] = Limits(
            rpm=limit if field == "rpm" else None,
            tpm=limit if field == "tpm" else None,
            budget=limit if field == "budget" else None,
        )
    return out


def message(answer: web.Response | None) -> str:
    """What a 429 says."""
    assert answer is not None and answer.status == 429
    assert isinstance(answer.body, bytes)
    return str(json.loads(answer.body)["error"]["message"])


@dataclass
class Harness:
    gateway: Gateway
    url: str
    http: aiohttp.ClientSession
    snap: list[Snapshot]

    async def post(
        self, body: dict[str, Any], key: str = KEY, path: str = "/v1/chat/completions"
    ) -> tuple[int, Any, str | None]:
        async with self.http.post(
            self.url + path, json=body, headers={"Authorization": f"Bearer {key}"}
        ) as resp:
            text = await resp.text()
            try:
                answer = json.loads(text)
            except ValueError:
                answer = text
            return resp.status, answer, resp.headers.get("Retry-After")

    async def models(self, key: str = KEY) -> list[str]:
        async with self.http.get(
            self.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}
        ) as resp:
            return [m["id"] for m in (await resp.json())["data"]]


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path, levels: dict[str, Limits], models: tuple[str, ...] = ("m",)
) -> AsyncIterator[Harness]:
    """A gateway before one fake engine (7 prompt and 5 completion tokens an answer),
    serving ``models``, with KEY under acme > vision > demo and the limits given."""
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    engine = await FakeEngine().start()
    view = NodeView(id="a", cert_serial=1, state=NodeState.READY, address="127.0.0.1")
    catalog = SimpleNamespace(models={}, version=1)
    for i, name in enumerate(models):
        rid = f"{name}.default.0000000{i}"
        view.shards[rid] = ShardStatus(replica_id=rid, state=ShardState.READY, port=engine.port)
        profile = Profile(name="default", engine="llama.cpp", replicas=1)
        catalog.models[name] = Model(
            name=name, source="hf:a/b", engine="llama.cpp", profiles=(profile,), context=4096
        )
    nodes = SimpleNamespace(nodes={"a": view}, version=1)
    snap = [tree(**levels)]
    gateway = Gateway(
        store,
        nodes,
        catalog,
        b"s" * 32,
        GatewayConfig(start_wait=0.0),
        lambda name, start: None,
        tree=lambda: snap[0],
    )
    gateway.keys.load(
        [
            record("k1", KEY, levels.get("key", Limits())),
            record("k2", OTHER),
        ]
    )
    try:
        async with served(gateway) as (url, http):
            yield Harness(gateway, url, http, snap)
    finally:
        await engine.stop()
        await store.close()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("tightest", LEVELS)
async def test_the_tightest_tokens_a_minute_of_four_levels_wins(
    tmp_path: Path, tightest: str, stream: bool
) -> None:
    # 12 tokens an answer: at 20 a minute the third request is refused, at 100 the ninth.
    async with harness(tmp_path, at_each(tightest, "tpm", 20, 100)) as h:
        answers = [await h.post({**CHAT, "stream": stream}) for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 429]
        _, body, retry = answers[2]
        assert body["error"]["message"] == (
            f"over {NAMED[tightest]}'s limit of 20 tokens per minute; try again in {retry} s"
        )
        assert retry is not None and 1 <= int(retry) <= 60


@pytest.mark.parametrize("tightest", LEVELS)
async def test_the_tightest_requests_a_minute_of_four_levels_wins(
    tmp_path: Path, tightest: str
) -> None:
    async with harness(tmp_path, at_each(tightest, "rpm", 2, 50)) as h:
        statuses = [(await h.post(CHAT))[0] for _ in range(3)]
        assert statuses == [200, 200, 429]
        _, body, _ = await h.post(CHAT)
        assert (
            f"over {NAMED[tightest]}'s limit of 2 requests per minute" in (body["error"]["message"])
        )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("tightest", LEVELS)
async def test_the_tightest_budget_of_four_levels_wins(
    tmp_path: Path, tightest: str, stream: bool
) -> None:
    async with harness(tmp_path, at_each(tightest, "budget", 30, 1000)) as h:
        statuses = [(await h.post({**CHAT, "stream": stream}))[0] for _ in range(4)]
        assert statuses == [200, 200, 200, 429]  # 36 tokens used of 30
        _, body, retry = await h.post(CHAT)
        assert (
            f"over {NAMED[tightest]}'s limit of 30 tokens a month (its budget)"
            in (body["error"]["message"])
        )
        assert retry is not None and int(retry) > 60  # the month's end, not a minute's


@pytest.mark.parametrize("level", LEVELS)
async def test_a_model_is_used_only_when_every_level_naming_models_allows_it(
    tmp_path: Path, level: str
) -> None:
    # Every level allows m*, and one of them only mini: m-big is refused and unlisted.
    levels = {
        lv: Limits(models=("mini",) if lv == level else ("m*",)) for lv in ("key", *LEVELS[1:])
    }
    async with harness(tmp_path, levels, models=("mini", "m-big")) as h:
        status, body, _ = await h.post({**CHAT, "model": "m-big"})
        assert status == 404 and body["error"]["code"] == "model_not_found"
        assert (await h.post({**CHAT, "model": "mini"}))[0] == 200
        assert await h.models() == ["mini"]


async def test_a_level_naming_no_models_leaves_them_to_the_others(tmp_path: Path) -> None:
    async with harness(tmp_path, {"team": Limits(models=("m-*",))}, models=("mini", "m-big")) as h:
        assert await h.models() == ["m-big"]
        assert (await h.post({**CHAT, "model": "mini"}))[0] == 404


async def test_a_projects_limits_are_its_keys_together(tmp_path: Path) -> None:
    async with harness(tmp_path, {"project": Limits(tpm=30)}) as h:
        assert (await h.post(CHAT))[0] == 200
        assert (await h.post(CHAT, key=OTHER))[0] == 200
        assert (await h.post(CHAT))[0] == 200  # 24 of 30 before it
        status, body, _ = await h.post(CHAT, key=OTHER)
        assert status == 429 and "project vision/demo" in body["error"]["message"]


async def test_a_limit_set_on_a_level_holds_for_the_minute_already_counted(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path, {}) as h:
        for _ in range(2):
            assert (await h.post(CHAT))[0] == 200
        assert (await h.post(CHAT, key=OTHER))[0] == 200  # 36 tokens, no limit yet
        # The team's limit is set (OrgService.changed tells the key book).
        h.snap[0] = tree(team=Limits(tpm=36, budget=100))
        h.gateway.keys.relevel()
        status, body, _ = await h.post(CHAT)
        assert status == 429 and "team vision's limit of 36 tokens" in body["error"]["message"]
        # Renamed, the team is named as it is now.
        renamed = tree(team=Limits(tpm=36))
        renamed.teams["t1"] = replace(renamed.teams["t1"], name="sight")
        h.snap[0] = renamed
        h.gateway.keys.relevel()
        assert "team sight's" in (await h.post(CHAT))[1]["error"]["message"]
        # Lifted, it no longer refuses.
        h.snap[0] = tree()
        h.gateway.keys.relevel()
        assert (await h.post(CHAT))[0] == 200


# -------------------------------------------------------- the key book on its own


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def book(tmp_path: Path, snap: Snapshot, *records: ApiKeyRecord) -> KeyBook:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    keys = KeyBook(Usage(store, Clock(1_800_000_000.0)), Clock(1_800_000_000.0), lambda: snap)
    keys.load(list(records))
    await store.close()
    return keys


def key_of(keys: KeyBook, secret: str) -> Key:
    found = keys.authorise(f"Bearer {secret}")
    assert isinstance(found, Key)
    return found


async def test_other_control_planes_counts_of_keys_add_up_per_level(tmp_path: Path) -> None:
    keys = await book(
        tmp_path, tree(project=Limits(tpm=40)), record("k1", KEY), record("k2", OTHER)
    )
    k1 = key_of(keys, KEY)
    # k1 has no limit of its own, but its project has: its counts are sent to the others.
    keys.usage.add(k1, "m", "r", 7, 5)
    assert keys.counts() == {"k1": [0, 12]}
    assert keys.over_limit(k1) is None
    # Another control plane said k2 had 30 tokens this minute: the project is at 42 of 40.
    keys.heard({"k2": (1, 30)})
    over = keys.over_limit(k1)
    assert "project vision/demo's limit of 40 tokens per minute" in message(over)
    # Heard again without it: under the limit again.
    keys.heard({})
    assert keys.over_limit(k1) is None


async def test_a_budget_counts_what_a_standby_sent_for_any_key_of_the_level(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    clock = Clock(1_800_000_000.0)
    snap = tree(org=Limits(budget=100))
    keys = KeyBook(Usage(store, clock), clock, lambda: snap)
    keys.load([record("k1", KEY), record("k2", OTHER)])
    k1 = key_of(keys, KEY)
    keys.used("k2", 99)  # the leader hears a standby's usage of k2
    assert keys.over_limit(k1) is None
    keys.usage.add(k1, "m", "r", 1, 0)
    assert "organisation acme's limit of 100 tokens a month" in message(keys.over_limit(k1))
    # The month read again from the store, which has k1's token (pending) and not the
    # 99 (the leader's store has them): the level's month is its keys' as read.
    await keys.usage.load_month()
    assert keys.levels[("org", "o1")].month == 1 and keys.over_limit(k1) is None
    await store.close()


async def test_a_personal_key_is_under_its_organisation_only(tmp_path: Path) -> None:
    snap = tree(project=Limits(rpm=1), team=Limits(rpm=1), org=Limits(rpm=3))
    keys = await book(tmp_path, snap, record("k1", KEY, person_id="u1"))
    k1 = key_of(keys, KEY)
    assert [level.label for level in k1.chain] == ["organisation acme"]
    for _ in range(3):
        assert keys.over_limit(k1) is None
        keys.admitted(k1)
    over = keys.over_limit(k1)
    assert "organisation acme's limit of 3 requests" in message(over)


async def test_the_longest_wait_is_named_where_several_levels_refuse(tmp_path: Path) -> None:
    snap = tree(project=Limits(rpm=1), org=Limits(budget=5))
    keys = await book(tmp_path, snap, record("k1", KEY))
    k1 = key_of(keys, KEY)
    keys.admitted(k1)
    keys.usage.add(k1, "m", "r", 5, 0)
    assert "organisation acme's limit of 5 tokens a month" in message(keys.over_limit(k1))


async def test_a_level_limiting_nothing_is_left_out_of_the_chain(tmp_path: Path) -> None:
    keys = await book(tmp_path, tree(team=Limits(tpm=10)), record("k1", KEY))
    assert [level.label for level in key_of(keys, KEY).chain] == ["team vision"]
    keys = await book(tmp_path / "bare", tree(), record("k1", KEY))
    k1 = key_of(keys, KEY)
    assert k1.chain == () and not k1.shared and keys.counts() == {}
