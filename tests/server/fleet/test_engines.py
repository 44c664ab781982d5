"""The engines the fleet runs: server.yaml's (or this release's pin) as the base, an
operator's changes over it kept in the store and audited, and each node's standing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.enginepins import LLAMACPP_PIN, PINNED
from llmgw.server.fleet.engines import SETTING, FleetEngines, PinError, node_row
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.principal import Principal
from llmgw.server.store import SQLiteStore
from llmgw.wire.messages import EngineInfo, WantedEngines

HEX = "cd" * 32
ASSET = "llama-b6000-bin-ubuntu-x64.tar.gz"

# The caller, as the audit log names them.
ADMIN_X = Principal("admin@x", "admin", "token")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "s.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def QUIET(engine: str | None, old: str | None, new: str | None) -> None:
    """Where a test does not look at what changed."""


def want(version: str, sha256: dict[str, str] | None = None, index_url: str | None = None) -> Any:
    return {"version": version, "sha256": sha256 or {}, "index_url": index_url}


async def test_the_base_is_server_yaml_or_this_releases_pin(store: SQLiteStore) -> None:
    pin = FleetEngines(store, None, QUIET)
    assert pin.wanted == PINNED
    assert pin.version_of("llama.cpp") == LLAMACPP_PIN and pin.version_of("vllm") is None
    assert pin.source_of("llama.cpp") == "server.yaml"
    # A fleet of its own pin never shares the module's: changing it changes no other.
    pin.base["llama.cpp"]["sha256"]["x"] = HEX
    assert "x" not in PINNED["llama.cpp"]["sha256"]

    yaml = FleetEngines(store, {"llama.cpp": 6000, "vllm": "0.11.0", "sglang": None}, QUIET)
    assert yaml.wanted == {"llama.cpp": want("b6000"), "vllm": want("0.11.0")}
    assert list(yaml.wanted) == ["llama.cpp", "vllm"]
    assert yaml.version_of("sglang") is None
    # An empty map names nothing: not the pin.
    assert FleetEngines(store, {}, QUIET).wanted == {}
    with pytest.raises(PinError, match="tgi"):
        FleetEngines(store, {"tgi": "1"}, QUIET)


async def test_set_unset_and_build_change_the_wish_and_are_audited(store: SQLiteStore) -> None:
    calls: list[tuple[str | None, str | None, str | None]] = []
    fleet = FleetEngines(
        store, {"llama.cpp": "b5000"}, lambda engine, old, new: calls.append((engine, old, new))
    )
    assert fleet.message("gpu01") == WantedEngines(
        version=0, engines={"llama.cpp": want("b5000")}, build="auto"
    )

    doc = await fleet.set("llama.cpp", {"version": 6000, "sha256": {ASSET: HEX}}, ADMIN_X)
    assert fleet.version == 1 and calls == [("llama.cpp", "b5000", "b6000")]
    assert fleet.wanted == {"llama.cpp": want("b6000", {ASSET: HEX})}
    assert (
        doc
        == fleet.document()
        == {
            "version": 1,
            "engines": [
                {
                    "engine": "llama.cpp",
                    "version": "b6000",
                    "sha256": {ASSET: HEX},
                    "index_url": None,
                    "packages": {},
                    "source": "ctl",
                }
            ],
            "builds": {},
        }
    )

    await fleet.set(
        "vllm",
        {"version": "0.11.0", "index_url": "https://pypi.ex/simple"},
        Principal("a@x", "operator", "session"),
    )
    assert calls[1:] == [("vllm", None, "0.11.0")]
    assert fleet.version_of("vllm") == "0.11.0"

    # Unset: the fleet names no version of it, over server.yaml's too.
    await fleet.set("llama.cpp", None, ADMIN_X)
    assert calls[2:] == [("llama.cpp", "b6000", None)]
    assert fleet.version_of("llama.cpp") is None
    assert list(fleet.wanted) == ["vllm"]

    await fleet.set_build("gpu01", "cpu", ADMIN_X)
    assert calls[3:] == [(None, None, None)]
    assert fleet.build_of("gpu01") == "cpu" and fleet.build_of("gpu02") == "auto"
    msg = fleet.message("gpu01")
    assert (msg.version, msg.build, list(msg.engines)) == (4, "cpu", ["vllm"])
    assert fleet.message("gpu02").build == "auto"
    assert fleet.document()["builds"] == {"gpu01": "cpu"}

    await fleet.set_build("gpu01", "auto", ADMIN_X)  # auto is no choice: dropped
    assert fleet.builds == {} and fleet.version == 5

    history = await fleet.history()
    assert [(h["action"], h["target"], h["change"]) for h in history] == [
        ("engines.build", "gpu01", "gpu01: auto"),
        ("engines.build", "gpu01", "gpu01: cpu"),
        ("engines.unset", "llama.cpp", "llama.cpp not managed"),
        ("engines.set", "vllm", "vllm 0.11.0"),
        ("engines.set", "llama.cpp", "llama.cpp b6000, 1 sha256 pinned"),
    ]
    assert {h["actor"] for h in history} == {"admin@x", "a@x"}
    assert all(isinstance(h["at"], float) for h in history)
    assert [h["action"] for h in await fleet.history(limit=2)] == ["engines.build"] * 2


async def test_other_audit_entries_are_not_engine_history(store: SQLiteStore) -> None:
    fleet = FleetEngines(store, None, QUIET)
    await store.audit("admin@x", "model.serve", "m", "")
    await fleet.set("llama.cpp", "b1", ADMIN_X)
    await store.audit("admin@x", "agents.set", "agents.default", "")
    assert [h["action"] for h in await fleet.history()] == ["engines.set"]


async def test_a_refused_change_changes_nothing(store: SQLiteStore) -> None:
    calls: list[Any] = []
    fleet = FleetEngines(store, {"llama.cpp": "b5000"}, lambda *args: calls.append(args))
    await fleet.set("llama.cpp", "b6000", ADMIN_X)
    await fleet.set_build("gpu01", "cpu", ADMIN_X)
    calls.clear()
    before = (
        fleet.document(),
        fleet.version,
        dict(fleet.overrides),
        dict(fleet.builds),
        await store.get_setting(SETTING),
        await fleet.history(),
    )
    refusals: list[tuple[Any, str]] = [
        (fleet.set("tgi", "1.0", ADMIN_X), "'tgi' is not an engine"),
        (fleet.set("tgi", None, ADMIN_X), "'tgi' is not an engine"),
        (fleet.set("llama.cpp", "b 1", ADMIN_X), "llama.cpp: 'b 1' is not a version"),
        (
            fleet.set("llama.cpp", {"version": "b1", "sha256": {ASSET: "0"}}, ADMIN_X),
            "must be 64 hex digits",
        ),
        (
            fleet.set("llama.cpp", {"version": "b1", "index_url": "https://x/simple"}, "a"),
            "index_url is for vLLM",
        ),
        (fleet.set_build("gpu01", "cuda", ADMIN_X), "'cuda' is not a build"),
    ]
    for change, words in refusals:
        with pytest.raises(PinError, match=words):
            await change
    after = (
        fleet.document(),
        fleet.version,
        dict(fleet.overrides),
        dict(fleet.builds),
        await store.get_setting(SETTING),
        await fleet.history(),
    )
    assert after == before and calls == []


async def test_load_restores_the_changes_from_the_store(store: SQLiteStore) -> None:
    fleet = FleetEngines(store, {"llama.cpp": "b5000", "sglang": "0.5.0"}, QUIET)
    await fleet.set("llama.cpp", {"version": "b6000", "sha256": {ASSET: HEX}}, ADMIN_X)
    await fleet.set("sglang", None, ADMIN_X)
    await fleet.set_build("gpu01", "none", ADMIN_X)

    again = FleetEngines(store, {"llama.cpp": "b5000", "sglang": "0.5.0"}, QUIET)
    assert again.version == 0 and again.version_of("llama.cpp") == "b5000"
    await again.load()
    assert again.document() == fleet.document()
    assert again.version == 3 and again.version_of("sglang") is None
    assert again.message("gpu01") == fleet.message("gpu01")
    assert again.source_of("llama.cpp") == "ctl"

    # Nothing stored yet: the base stands at version 0.
    empty = FleetEngines(store, None, QUIET)
    await store.put_setting(SETTING, "")
    await empty.load()
    assert empty.wanted == PINNED and empty.version == 0


def view(
    engines: list[EngineInfo] | None = None,
    progress: dict[str, str] | None = None,
    probed: bool = True,
    nid: str = "gpu01",
) -> NodeView:
    return NodeView(
        id=nid,
        cert_serial=1,
        engines=engines or [],
        engines_probed=probed,
        engine_progress=progress or {},
    )


def installed(version: str, name: str = "llama.cpp") -> EngineInfo:
    return EngineInfo(name=name, path="/x", version=version, build="cpu", origin="installed")


@pytest.mark.parametrize(
    ("node", "build", "state"),
    [
        (view(probed=False), "auto", "unknown"),
        # Before it reported, whatever else it has says nothing.
        (view([installed("b6000")], probed=False), "auto", "unknown"),
        (view([installed("b5000"), installed("b6000")]), "auto", "ready"),
        (
            view([EngineInfo(name="llama.cpp", path="/x", version="b1", origin="configured")]),
            "auto",
            "configured",
        ),
        (view([installed("b5000")]), "none", "off"),
        (view([installed("b6000")]), "none", "ready"),
        (view(progress={"llama.cpp": "installing: unpacking"}), "auto", "installing"),
        (view(progress={"llama.cpp": "install failed: HTTP 404"}), "auto", "failed"),
        (view([installed("b5000")]), "auto", "missing"),
        (view([installed("b6000", "vllm")]), "auto", "missing"),
        (view(progress={"llama.cpp": "pinned in this node's settings to b1"}), "auto", "missing"),
    ],
)
def test_node_row_states(node: NodeView, build: str, state: str) -> None:
    row = node_row(node, "llama.cpp", "b6000", build)
    assert row["state"] == state
    assert (row["node"], row["engine"], row["wanted"], row["build"]) == (
        "gpu01",
        "llama.cpp",
        "b6000",
        build,
    )
    assert row["message"] == node.engine_progress.get("llama.cpp")


def test_node_row_lists_the_versions_there() -> None:
    node = view(
        [installed("b6000"), installed("b5000"), installed("b6000"), installed("0.1", "vllm")]
    )
    assert node_row(node, "llama.cpp", "b6000", "auto")["versions"] == ["b5000", "b6000"]


async def test_nodes_is_a_row_per_node_and_wanted_engine(store: SQLiteStore) -> None:
    fleet = FleetEngines(store, {"llama.cpp": "b6000", "vllm": "0.11.0"}, QUIET)
    await fleet.set_build("b", "none", ADMIN_X)
    views = [
        view([installed("b6000")], nid="b"),
        view([installed("b6000")], {"vllm": "installing: uv pip install"}, nid="a"),
    ]
    rows = fleet.nodes(views)
    assert [(r["node"], r["engine"], r["state"], r["build"]) for r in rows] == [
        ("a", "llama.cpp", "ready", "auto"),
        ("a", "vllm", "installing", "auto"),
        ("b", "llama.cpp", "ready", "none"),
        ("b", "vllm", "off", "none"),
    ]
