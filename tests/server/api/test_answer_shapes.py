"""The admin API's answers against their shapes (``llmgw.wire.admin``): a real admin app,
in process, with a node that reports every figure, a model of the catalog and an
external one, shards, a key, usage and energy, is asked every route the client and the
console read, and each answer must have exactly the keys its TypedDict declares (all
the required ones, no others), down through every nested shape, with values of the
declared types. So the server and the shapes the client reads cannot drift apart."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import httpx
import pytest

from llmgw.client import routes
from llmgw.client.routes import Route
from llmgw.enginepins import LLAMACPP_PIN
from llmgw.server.app import ControlPlane
from llmgw.server.catalog.model import Profile
from llmgw.server.fleet.fabrictest import FEATURE
from llmgw.server.fleet.ibtopology import parse_ibnetdiscover
from llmgw.server.gateway.limits import Key
from llmgw.server.people.asks import NewToken
from llmgw.server.store import Audit, ServerRecord
from llmgw.wire import admin
from llmgw.wire.hardware import (
    GPU,
    CardLinks,
    Disk,
    GpuHealth,
    GpuTopology,
    HostFacts,
    IbPort,
    NodeVitals,
    XidSeen,
)
from llmgw.wire.messages import (
    Compute,
    DownloadProgress,
    EngineInfo,
    Heartbeat,
    Message,
    Register,
    Response,
    ShardStatus,
    ShardUsage,
)
from llmgw.wire.states import ShardState
from tests.support.shapes import check, problems
from tests.support.tinymodel import write_tiny_model

GIB = 2**30
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "infiniband"
FABRIC_MAP = FIXTURES / "ibnetdiscover_2tier-rails_HDR_own.txt"
FABRIC_UUID = "5a1b2c3d-0000-4000-8000-000000000001"
SM_GUID = "0x0002c90300a1b2c3"
UPSTREAM = {"key": "sk-upstream", "weight": 2.0}


# ----------------------------------------------------------------------- the checker


def test_the_checker_finds_missing_extra_and_mistyped_keys() -> None:
    good = {"path": "/", "fstype": "ext4", "total": 10, "free": 5, "shared": False}
    assert problems(admin.DiskJson, good) == []
    assert problems(admin.DiskJson, {**good, "extra": 1}) == [
        "$: DiskJson does not declare 'extra'"
    ]
    del good["shared"]
    assert problems(admin.DiskJson, good) == ["$: DiskJson lacks 'shared'"]
    assert problems(list[admin.DiskJson], [{**good, "shared": "no"}]) == [
        "$[0].shared: 'no' is not bool"
    ]
    card = {"index": 0, "uuid": "GPU-1", "name": "H100"}
    assert problems(admin.CardJson, card) == []
    assert problems(admin.CardJson, {**card, "power": None}) == ["$.power: None is not float"]


def test_what_the_shapes_say_is_required_is_right_at_run_time() -> None:
    # The module is written without postponed annotations so that this holds on 3.11.
    assert admin.CardJson.__required_keys__ == {"index", "uuid", "name"}
    assert "adapters" in admin.ModelJson.__optional_keys__
    assert admin.ShapeJson.__required_keys__ == frozenset()


def test_a_profile_shows_every_field_of_the_catalog_s_profile() -> None:
    fields = set(Profile.__dataclass_fields__)
    assert fields <= admin.ProfileJson.__required_keys__


# ------------------------------------------------------------------------ the fleet


class FakeSession:
    """A node's stream as the control plane asks it: weights, collecting and logs."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[Message] = []

    def close(self, reason: str) -> None:
        pass

    async def send(self, msg: Message) -> None:
        self.sent.append(msg)

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        if self.fail and not kind.startswith("fabric."):
            raise ConnectionError("the node went away")
        if kind == "fabric.bw_serve":
            yield Response(id="1", result={})
        elif kind == "fabric.bw_run":
            yield Response(id="1", result={"gbps": 350.0})
        elif kind == "weights.list":
            entry = {
                "name": "org--model",
                "source": "hf:org/model",
                "path": "/var/lib/llmgw/weights/org--model",
                "files": [{"path": "model.gguf", "size": 1024, "partial": False}],
                "total_bytes": 1024,
                "complete": True,
            }
            yield Response(id="1", result=[entry])
        elif kind == "weights.collect":
            kept = [{"path": "/var/lib/llmgw/weights/x", "reason": "in use"}]
            yield Response(id="1", result={"removed": [], "kept": kept, "freed_bytes": 0})
        elif kind == "logs":
            yield Response(id="1", result=["line one", "line two"])


def card(index: int) -> GPU:
    return GPU(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA GB200",
        memory_total=180 * GIB,
        memory_used=20 * GIB,
        utilization=40,
        temperature=55,
        power=400.0,
        power_limit=1200.0,
        sm_active=0.4,
        pcie_gen=5,
        pcie_width=16,
        pcie_width_max=16,
        throttle=[],
    )


def health(index: int) -> GpuHealth:
    return GpuHealth(
        uuid=f"GPU-{index}",
        index=index,
        ecc_mode=True,
        xids=[XidSeen(code=79, count=1, last=1.7e9, meaning="fell off the bus")],
        fabric_state="Completed" if index == 0 else "In Progress",
        fabric_status="Success",
        fabric_cluster_uuid=FABRIC_UUID,
        fabric_clique_id=1,
        fabric_health={"summary": "Healthy"},
    )


@pytest.fixture
async def fleet(
    tmp_path: Path, plane: tuple[ControlPlane, httpx.AsyncClient]
) -> tuple[ControlPlane, httpx.AsyncClient, Path]:
    """Two nodes (one that fails every request), a model of the catalog with a shard
    downloading and one started by hand, an external model, a key, usage and energy."""
    cp, client = plane
    registry = cp.registry
    settings = {
        "version": 1,
        "values": {"discovery.slow_interval": {"value": 60, "source": "cluster"}},
        "problem": None,
    }
    for node, session in (("gpu-1", FakeSession()), ("gpu-2", FakeSession(fail=True))):
        await registry.enrolled(node, 1)
        host = HostFacts(
            hostname=node,
            os="Debian GNU/Linux 12",
            arch="x86_64",
            kernel="6.1",
            cpu_model="Grace",
            cpu_count=72,
            cpu_cores=72,
            cpu_flags=["sve"],
            memory_total=480 * GIB,
            memory_available=400 * GIB,
            disks=[Disk(path="/", fstype="ext4", total=2000 * GIB, free=900 * GIB)],
            gpus=[card(0), card(1)],
            gpu_source="nvml",
            cuda_version="12.8",
            topology=GpuTopology([CardLinks(0, numa_node=0, gpus={"1": "NV18"})]),
        )
        engine = EngineInfo(name="llama.cpp", path="/opt/llama", version=LLAMACPP_PIN)
        register = Register(
            node_id=node,
            version="1.0",
            host=host,
            address="10.0.0.5",
            features=["ibnetdiscover", FEATURE],
            engines=[engine],
            engines_probed=True,
            settings=settings,
        )
        await registry.register(register, session)
        port = IbPort(
            device="mlx5_0",
            port=1,
            state="ACTIVE",
            rate_gbps=400.0,
            link_layer="InfiniBand",
            port_guid="0x0002c90300aaaa01",
            master_sm_guid=SM_GUID,
            counters={"port_xmit_data": 10},
        )
        beat = Heartbeat(
            seq=1,
            memory_available=300 * GIB,
            cpu_percent=12.5,
            load=[1.0, 0.5, 0.2],
            gpus=[card(0), card(1)],
            shards=[ShardUsage(replica_id="by-hand", cpu_percent=3.0, rss=GIB)],
            memory_read_gbs=400.0,
            memory_read_one_core_gbs=40.0,
            gpu_health=[health(0), health(1)],
            vitals=NodeVitals(cpu_temperatures={"0": 50.0}, imex_running=True, imex_channels=1),
            health_warnings=["pcie: card 1 runs at x8. Fix: reseat it"],
            ib_ports=[port],
        )
        registry.heartbeat(node, beat)

    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    served = await client.post(
        "/api/v1/models", json={"source": str(tiny), "name": "tiny", "context": 256}
    )
    assert served.status_code == 201, served.text
    await cp.models.reconcile()
    replica = next(iter(cp.models.reconciler.tracks))
    registry.report(
        "gpu-1",
        ShardStatus(
            replica_id=replica,
            state=ShardState.DOWNLOADING,
            engine="llama.cpp",
            source=str(tiny),
            port=41000,
            fingerprint="f",
            compute=Compute(backend="CUDA", devices=["CUDA0"], offloaded_layers=2),
        ),
    )
    registry.report(
        "gpu-1",
        DownloadProgress(source=str(tiny), replica_ids=[replica], done=10, total=100),
    )
    registry.report(
        "gpu-1",
        ShardStatus(
            replica_id="by-hand",
            state=ShardState.READY,
            fingerprint="direct",
            engine="llama.cpp",
            source="hf:org/model",
            port=41001,
            pid=4242,
            started_at=1.7e9,
            last_lines=["ready"],
        ),
    )
    external = await client.post(
        "/api/v1/models/external",
        json={"name": "far", "base_url": "https://api.example/v1", "keys": [UPSTREAM]},
    )
    assert external.status_code == 201, external.text
    made = await client.post("/api/v1/keys", json={"name": "team", "rpm": 60})
    assert made.status_code == 201
    await cp.store.add_usage([("2025-03-01", made.json()["id"], "tiny", replica, 1, 10, 20)])
    cp.gateway.metrics.replica_tokens[("tiny", replica)] = 100
    registry.energy.joules[replica] = 50.0
    set_config = await client.post(
        "/api/v1/config", json={"key": "discovery.slow_interval", "value": "30"}
    )
    assert set_config.status_code == 200, set_config.text
    set_engine = await client.post(
        "/api/v1/engines", json={"engine": "llama.cpp", "version": "b6001"}
    )
    assert set_engine.status_code == 200, set_engine.text
    set_firewall = await client.post("/api/v1/firewall", json={"enabled": False})
    assert set_firewall.status_code == 200, set_firewall.text
    # A guard policy judged by the catalog's model, and a decision of it.
    policy = await client.post("/api/v1/guard/policies", json={"name": "pii", "judge": "tiny"})
    assert policy.status_code == 200, policy.text
    limits = cp.gateway.keys
    (record,) = [r for r in limits.records() if r.name == "team"]
    guarded = Key(replace(record, guard=("pii",)))
    await cp.guard.tool_arguments(guarded, "jira.get", {"q": "a@b.io"})
    # A map of the fabric as one of its nodes read it.
    read = (time.time(), "gpu-1", parse_ibnetdiscover(FABRIC_MAP.read_text()))
    cp.fabric_maps.maps[SM_GUID] = read
    return cp, client, tiny


def client_routes() -> dict[str, tuple[Route[Any], Any]]:
    """Every route the admin client calls, by its name there, with the shape it reads
    that route's answer as (the ``T`` of its ``Route[T]``)."""
    hints = get_type_hints(routes)
    return {
        name: (getattr(routes, name), get_args(hint)[0])
        for name, hint in hints.items()
        if get_origin(hint) is Route
    }


# Placeholders in the asks below, for what only the fleet knows.
TINY, KEY = "<tiny>", "<key>"
# Each route the client reads: its name in llmgw.client.routes, its path's parts, and
# its query.
Ask = tuple[str, tuple[str, ...], dict[str, Any] | None]
READS: list[Ask] = [
    ("STATUS", (), None),
    ("NODES", (), None),
    ("NODE", ("gpu-1",), None),
    ("HISTORY", ("gpu-1",), {"minutes": "60"}),
    ("LOGS", ("gpu-1",), {"source": "agent", "n": 10}),
    ("LOG_BATCH", ("gpu-1",), {"source": "agent", "n": 10, "follow": "1"}),
    ("REPLICAS", (), None),
    ("WEIGHTS", (), None),
    ("MODELS", (), None),
    ("MODEL", ("tiny",), None),
    ("MODEL", ("far",), None),
    ("EXPLAIN", ("tiny",), None),
    ("ADAPTERS", ("tiny",), None),
    ("PLAN", (), {"source": TINY}),
    ("KEYS", (), None),
    ("KEY", (KEY,), None),
    ("USAGE", (), {"since": "2025-03-01"}),
    ("USAGE_SUMS", (), {"since": "2025-03-01", "by": "org"}),
    ("ENERGY", (), None),
    ("SERVERS", (), None),
    ("VERSIONS", (), None),
    ("RELEASE", (), None),
    ("SETTINGS", (), None),
    ("NODE_SETTINGS", (), {"node": "gpu-1"}),
    ("SETTING", (), {"key": "discovery.slow_interval"}),
    ("SETTINGS_HISTORY", (), None),
    ("ENGINES", (), None),
    ("ENGINES_HISTORY", (), None),
    ("FIREWALL", (), None),
    ("FIREWALL_HISTORY", (), None),
    ("SLURM", (), None),
    ("SLURM_CONF", (), None),
    ("MCP_SERVERS", (), None),
    ("MCP_SERVER", ("llmgw:admin",), None),
    ("FINETUNES", (), None),
    ("GUARD_POLICIES", (), None),
    ("GUARD_POLICY", ("pii",), None),
    ("GUARD_DECISIONS", (), None),
    ("RESTART_STATUS", (), None),
    ("FABRICS", (), None),
    ("FABRIC_MAP", (SM_GUID,), None),
    ("NVLINK", (), None),
    ("ME", (), None),
    ("PEOPLE", (), None),
    ("ORGS", (), None),
    ("TEAMS", ("default",), None),
    ("PROJECTS", ("default",), None),
    ("MEMBERS", ("default",), None),
]
# Each change the client makes, in this order: its name, its path's parts, its body.
CHANGES: list[Ask] = [
    # Its node answers no finetune.* ask: the job comes back failed, in its shape.
    (
        "CREATE_FINETUNE",
        (),
        {
            "model": "tiny",
            "name": "tuned",
            "data": '{"prompt": "a", "completion": "b"}\n',
            "node": "gpu-1",
            "mib": 1000,
            "base": "hf:org/base",
        },
    ),
    ("CHANGE_MODEL", ("tiny", "context"), {"slots": 2}),
    ("CHANGE_MODEL", ("tiny", "stop"), {}),
    ("CHANGE_MODEL", ("tiny", "start"), {}),
    ("CHANGE_MODEL", ("tiny", "replicas"), {"replicas": 2}),
    ("DEMAND", ("tiny",), {}),
    ("ADD_ADAPTER", ("tiny",), {"name": "sql", "source": "/loras/sql.gguf"}),
    ("REMOVE_ADAPTER", ("tiny", "sql"), None),
    ("SERVE", (), {"source": TINY, "name": "tiny2", "context": 256}),
    ("JOBS", (), None),  # the serve's job, as it began
    ("EXTERNAL", (), {"name": "far2", "base_url": "https://b.example/v1", "keys": [UPSTREAM]}),
    ("REMOVE_MODEL", ("far",), None),
    ("MARK", ("gpu-1", "cordon"), {}),
    ("MARK", ("gpu-1", "labels"), {"set": {"rack": "r1"}, "remove": []}),
    (
        "START_SHARD",
        ("gpu-1",),
        {"replica_id": "r-x", "engine": "llama.cpp", "port": 41002, "source": "/m.gguf"},
    ),
    ("STOP_SHARD", ("gpu-1", "r-x"), None),
    ("COLLECT", (), {}),
    ("TOKEN", (), {"ttl_seconds": 600}),
    ("CREATE_KEY", (), {"name": "other"}),
    ("UPDATE_KEY", (KEY,), {"priority": 3}),
    ("KEY_LIMITS", (KEY,), {"tools": ["jira.*", "wiki.get"], "rpm": 9}),
    ("MCP_GRANTS", (), {"server": "jira"}),
    ("REVOKE_KEY", (KEY,), None),
    ("SERVING", (), {"stopped": False}),
    ("SERVER_TOKEN", (), {"ttl_seconds": 600}),
    ("REMOVE_SERVER", ("old-cp",), None),
    ("SET_SETTING", (), {"key": "discovery.slow_interval", "unset": True}),
    ("SET_ENGINE", (), {"engine": "llama.cpp", "unset": True}),
    ("ENGINE_BUILD", ("gpu-1",), {"build": "cpu"}),
    ("SET_FIREWALL", (), {"networks": ["10.0.0.0/8"]}),
    ("SLURM_SETUP", (), {"controller": "gpu-1", "nodes": ["gpu-1", "gpu-2"]}),
    ("SLURM_LEND", (), {"nodes": ["gpu-2"]}),
    ("SLURM_RECLAIM", (), {"nodes": ["gpu-2"]}),
    ("SLURM_POLICY", (), {"keep_free_gpus": 1}),
    ("SLURM_OFF", (), {"now": True}),
    (
        "ADD_MCP",
        (),
        {"name": "tickets", "url": "http://127.0.0.1:9/mcp", "bearer": "t0k", "timeout": 5},
    ),
    ("CHANGE_MCP", ("tickets",), {"rate": 5, "headers": ["X-Org=acme"]}),
    ("SWITCH_MCP", ("tickets", "off"), {}),
    ("SWITCH_MCP", ("tickets", "on"), {}),
    ("TEST_MCP", ("tickets",), {}),  # nothing listens there: ok false, failure connect
    ("REMOVE_MCP", ("tickets",), None),
    ("ADD_GUARD_POLICY", (), {"name": "strict", "pii": "block"}),
    ("GUARD_JUDGE_CHECK", (), {"policy": "pii"}),
    ("REMOVE_GUARD_POLICY", ("strict",), None),
    ("FABRIC_TEST", (), {"a": "gpu-1", "b": "gpu-2"}),
    ("CREATE_PERSON", (), {"login": "carol", "role": "viewer"}),
    ("CHANGE_PERSON", ("carol",), {"name": "Carol"}),
    ("CREATE_TEAM", ("default",), {"name": "ml"}),
    ("SET_MEMBER", ("default",), {"person": "carol", "role": "manager", "team": "ml"}),
    # Its nodes do not answer restart (named as skipped); this control plane's own
    # relaunch only sets its stopping.
    ("RESTART", (), None),
    # Last: the token this client holds is refused from then on (it takes the new one).
    ("ROTATE_ADMIN_TOKEN", (), None),
]


def placed(value: Any, tiny: Path, key: str) -> Any:
    """``value`` with the placeholders filled in."""
    if isinstance(value, dict):
        return {k: placed(v, tiny, key) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(placed(v, tiny, key) for v in value)
    return {TINY: str(tiny), KEY: key}.get(value, value) if isinstance(value, str) else value


async def answered(client: httpx.AsyncClient, route: Route[Any], path: str, body: Any) -> Any:
    answer = await client.request(route.method, path, json=body)
    assert answer.status_code < 300, (path, answer.text)
    if answer.headers["content-type"].startswith("application/x-ndjson"):
        return [json.loads(line) for line in answer.text.splitlines()]
    return answer.json()


async def test_every_answer_the_client_reads_is_the_shape_it_reads_it_as(
    fleet: tuple[ControlPlane, httpx.AsyncClient, Path],
) -> None:
    cp, client, tiny = fleet
    routes = client_routes()
    key = (await client.get("/api/v1/keys")).json()[0]["id"]
    await cp.store.put_server(
        ServerRecord("old-cp", "9", "10.0.0.9:8080", "10.0.0.9:8443", "10.0.0.9:8444", 1.7e9),
        Audit("test", "server.add", "old-cp"),
    )
    await cp.ha.reload_servers()
    for name, parts, asked in [*READS, *CHANGES]:
        route, shape = routes[name]
        parts, asked = placed(parts, tiny, key), placed(asked, tiny, key)
        query = asked if route.method == "GET" else None
        body = None if route.method == "GET" else asked
        answer = await answered(client, route, route.at(*parts, query=query), body)
        if name == "LOG_BATCH":  # newline-delimited: each line is one answer
            found = [p for batch in answer for p in problems(shape, batch, name)]
        else:
            found = problems(shape, answer, f"{route.method} {route.at(*parts)}")
        assert not found, "\n".join(found)
        if name == "ROTATE_ADMIN_TOKEN":
            client.headers["authorization"] = f"Bearer {answer['token']}"
    # What the client reads nowhere but scripts do.
    check(admin.VersionJson, (await client.get("/api/v1/version")).json())
    check(admin.ServingJson, (await client.get("/api/v1/serving")).json())


# People, organisations, the audit and ``llmgw login``: asked in this order, by the admin
# token, then (``AS_ANN``) as the person made first, with a personal token of hers.
PEOPLE_ASKS: list[Ask] = [
    ("CREATE_PERSON", (), {"login": "ann", "role": "admin"}),
    ("ME", (), None),
    ("PEOPLE", (), None),
    ("PERSON", ("ann",), None),
    ("CHANGE_PERSON", ("ann",), {"name": "Ann"}),
    ("CREATE_ORG", (), {"name": "vision"}),
    ("ORGS", (), None),
    ("ORG", ("vision",), None),
    ("RENAME_ORG", ("vision",), {"name": "sight"}),
    ("CREATE_TEAM", ("sight",), {"name": "cv"}),
    ("TEAMS", ("sight",), None),
    ("CREATE_PROJECT", ("sight",), {"name": "demo", "team": "cv"}),
    ("PROJECTS", ("sight",), None),
    ("SET_MEMBER", ("sight",), {"person": "ann", "role": "admin", "team": "cv"}),
    ("MEMBERS", ("sight",), None),
    ("ORG_LIMITS", ("sight",), {"rpm": 10, "tools": ["jira.*"]}),
    ("TEAM_LIMITS", ("sight", "cv"), {"tpm": 100}),
    ("PROJECT_LIMITS", ("sight", "demo"), {"budget": 1000, "models": ["qwen*"], "tools": []}),
    # A revoke answers each level it changed beneath.
    ("TEAM_LIMITS", ("sight", "cv"), {"tools": ["jira.get"], "revoke_tools": "wiki"}),
    ("AUDIT", (), {"org": "sight"}),
    ("REMOVE_MEMBER", ("sight", "ann"), {"team": "cv"}),
    ("REMOVE_PROJECT", ("sight", "demo"), None),
    ("REMOVE_TEAM", ("sight", "cv"), None),
    ("REMOVE_ORG", ("sight",), None),
]
AS_ANN: list[Ask] = [
    ("CREATE_PERSON_TOKEN", ("ann",), {"name": "laptop"}),
    ("PERSON_TOKENS", ("ann",), None),
    ("DEVICE_LOGIN", (), {"client": "llmgw ctl on test"}),
    # Between these two, Ann approves the code on the pages (here: its service).
    ("DEVICE_TOKEN", (), {"device_code": "<device>"}),
    ("REVOKE_PERSON_TOKEN", ("ann", "<token>"), None),
]


async def test_the_people_routes_answer_the_shapes_the_client_reads(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, client = plane
    routes = client_routes()

    async def ask(name: str, parts: tuple[str, ...], asked: Any) -> Any:
        route, shape = routes[name]
        query = asked if route.method in ("GET", "DELETE") else None
        body = None if route.method in ("GET", "DELETE") else asked
        answer = await answered(client, route, route.at(*parts, query=query), body)
        check(shape, answer)
        return answer

    for name, parts, asked in PEOPLE_ASKS:
        await ask(name, parts, asked)
    ann = cp.directory.by_login("ann")
    assert ann is not None
    acting = cp.directory.principal(ann, "token")
    assert acting is not None
    _, token = await cp.people.new_token("ann", NewToken(name="shapes"), acting)
    client.headers["authorization"] = f"Bearer {token}"
    found: dict[str, Any] = {}
    for name, parts, asked in AS_ANN:
        if name == "DEVICE_TOKEN":
            cp.device_logins.approve(found["DEVICE_LOGIN"]["user_code"], acting)
            asked = {"device_code": found["DEVICE_LOGIN"]["device_code"]}
        if name == "REVOKE_PERSON_TOKEN":
            parts = ("ann", found["DEVICE_TOKEN"]["id"])
        found[name] = await ask(name, parts, asked)
    assert found["REVOKE_PERSON_TOKEN"]["revoked_at"] is not None


# Routes whose answer needs more than this fleet (a signed release served from loopback,
# a zipapp to swap): their shapes are checked where they are tested, with ``check``.
ELSEWHERE = {
    "JOB": "tests/server/catalog/test_jobs.py",
    "UPGRADE": "tests/server/upgrade/test_service.py",
    "UPGRADE_STATUS": "tests/server/upgrade/test_service.py",
    # A hub stand-in on loopback, the cluster's hf_endpoint pointed at it.
    "EXPLORE": "tests/client/test_ctl_explore.py",
    "EXPLORE_REPO": "tests/client/test_ctl_explore.py",
    "FINETUNE": "tests/server/api/test_finetunes.py",
    "CANCEL_FINETUNE": "tests/server/api/test_finetunes.py",
}


def test_every_route_of_the_client_is_asked_above() -> None:
    asked = {name for name, _, _ in [*READS, *CHANGES, *PEOPLE_ASKS, *AS_ANN]} | set(ELSEWHERE)
    assert asked == set(client_routes())


async def test_every_route_of_the_client_is_one_the_server_declares(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, _ = plane
    declared = [(op.method, re.sub(r"\{[a-z_]+\}", "{}", op.path)) for op in cp.routes()]

    def matches(route: Route[Any], method: str, path: str) -> bool:
        # The client's ``{}`` is any one segment: a name, or an action (stop, cordon).
        mine, theirs = route.path.split("/"), path.split("/")
        return (
            method == route.method
            and len(mine) == len(theirs)
            and all(m in ("{}", t) for m, t in zip(mine, theirs, strict=True))
        )

    unknown = [
        f"{route.method} {route.path}"
        for route, _ in client_routes().values()
        if not any(matches(route, method, path) for method, path in declared)
    ]
    assert unknown == []


async def test_the_answers_are_not_empty_where_the_fleet_has_something(
    fleet: tuple[ControlPlane, httpx.AsyncClient, Path],
) -> None:
    """Each shape was checked against a real value, not an empty list or a null."""
    cp, client, _ = fleet
    node = (await client.get("/api/v1/nodes/gpu-1")).json()
    for key in ("disks", "gpu_health", "vitals", "topology", "ib_ports", "engines", "settings"):
        assert node[key], key
    history = (await client.get("/api/v1/nodes/gpu-1/history")).json()
    assert history["gpus"] and history["t"]
    replicas = (await client.get("/api/v1/replicas")).json()
    assert any(r["download"] for r in replicas) and any(r["model"] is None for r in replicas)
    models = {m["name"]: m for m in (await client.get("/api/v1/models")).json()}
    assert models["tiny"]["shape"] and models["tiny"]["profiles"][0]["status"]
    assert models["far"]["external"]["endpoints"]
    weights = (await client.get("/api/v1/weights")).json()
    assert {"error" in w for w in weights} == {True, False}
    fabrics = (await client.get("/api/v1/fabrics")).json()
    assert fabrics["fabrics"] and fabrics["fabrics"][0]["ports"]
    assert fabrics["fabrics"][0]["topology_read_at"]
    fabric_map = (await client.get(f"/api/v1/fabrics/{SM_GUID}/topology")).json()
    assert fabric_map["links"] and fabric_map["rail_misses"] and fabric_map["tiers"]
    nvlink = (await client.get("/api/v1/nvlink")).json()
    assert nvlink["domains"] and nvlink["domains"][0]["trays"]
    for path in ("/api/v1/energy", "/api/v1/usage?since=2025-03-01", "/api/v1/engines/history"):
        assert (await client.get(path)).json(), path
    engines = (await client.get("/api/v1/engines")).json()
    assert engines["engines"] and engines["nodes"]
