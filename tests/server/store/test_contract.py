"""What every store backend keeps and gives back: settings, admin and join tokens,
nodes, models, gateway keys, usage and the audit trail; absent rows, order, updates,
deletes and the conflicts a backend refuses.

Each test runs once per backend in ``conftest.BACKENDS``. Atomicity, reopening and a
closed store are in ``test_lifecycle.py``; what only SQLite does in ``test_sqlite.py``.
"""

from __future__ import annotations

import time

import pytest

from llmgw.server.people.records import Limits, Org, Project, Team
from llmgw.server.store import ApiKeyRecord, Audit, JoinTokenRecord, ServerRecord, Store
from tests.server.store.conftest import Backend, audits

# ------------------------------------------------------------------------- settings


async def test_a_setting_is_absent_then_kept_then_replaced(store: Store) -> None:
    assert await store.get_setting("cluster.name") is None
    await store.put_setting("cluster.name", "lab")
    await store.put_setting("cluster.other", "x")
    assert await store.get_setting("cluster.name") == "lab"
    await store.put_setting("cluster.name", "prod")
    assert await store.get_setting("cluster.name") == "prod"
    assert await store.get_setting("cluster.other") == "x"
    await store.put_setting("cluster.name", "")
    assert await store.get_setting("cluster.name") == ""


# -------------------------------------------------------------------- admin tokens


async def test_admin_tokens_keep_their_hashes(store: Store) -> None:
    assert await store.admin_token_hashes() == []
    await store.add_admin_token("a1", "hash-1")
    await store.add_admin_token("a2", "hash-2")
    assert sorted(await store.admin_token_hashes()) == ["hash-1", "hash-2"]


async def test_an_admin_token_id_or_hash_is_taken_once(store: Store, backend: Backend) -> None:
    await store.add_admin_token("a1", "hash-1")
    with pytest.raises(backend.conflict):
        await store.add_admin_token("a2", "hash-1")  # the same hash under a new id
    with pytest.raises(backend.conflict):
        await store.add_admin_token("a1", "hash-2")  # the same id with a new hash
    assert await store.admin_token_hashes() == ["hash-1"]


async def test_replacing_the_admin_tokens_leaves_the_new_one_alone_and_audited(
    store: Store,
) -> None:
    await store.add_admin_token("initial", "hash-1")
    await store.add_admin_token("second", "hash-2")
    rotated = Audit("admin@10.0.0.7", "admin_token.rotate", "admin token", "old tokens: 2")
    await store.replace_admin_tokens("r1", "hash-3", rotated)
    assert await store.admin_token_hashes() == ["hash-3"]
    # Again, to the hash it replaced: the id and hash of the token it removes are free.
    await store.replace_admin_tokens("r1", "hash-1", rotated)
    assert await store.admin_token_hashes() == ["hash-1"]
    trail = await audits(store)
    assert trail == [("admin@10.0.0.7", "admin_token.rotate", "admin token", "old tokens: 2")] * 2


# --------------------------------------------------------------------- join tokens


async def test_join_token_is_used_once(store: Store) -> None:
    rec = JoinTokenRecord("t1", "sealed1:x", 1.0, 100.0, "admin")
    await store.add_join_token(rec)
    assert await store.get_join_token("t1") == rec
    assert await store.use_join_token("t1", "n1", 5.0) is True
    assert await store.use_join_token("t1", "n2", 6.0) is False
    used = await store.get_join_token("t1")
    assert used is not None and (used.used_by, used.used_at) == ("n1", 5.0)
    assert await store.get_join_token("nope") is None


async def test_join_tokens_are_kept_apart(store: Store) -> None:
    a = JoinTokenRecord("ta", "sealed:a", 1.5, 3601.5, "admin")
    b = JoinTokenRecord("tb", "sealed:b", 2.25, 7202.25, "ops")
    await store.add_join_token(a)
    await store.add_join_token(b)
    assert await store.use_join_token("tb", "n9", 10.0) is True
    assert await store.get_join_token("ta") == a  # using one leaves the other unused
    assert await store.get_join_token("tb") == JoinTokenRecord(
        "tb", "sealed:b", 2.25, 7202.25, "ops", used_at=10.0, used_by="n9"
    )


async def test_an_unknown_join_token_cannot_be_used(store: Store) -> None:
    assert await store.use_join_token("ghost", "n1", 5.0) is False
    assert await store.get_join_token("ghost") is None


async def test_a_join_token_id_is_taken_once(store: Store, backend: Backend) -> None:
    first = JoinTokenRecord("t1", "sealed:first", 1.0, 100.0, "admin")
    await store.add_join_token(first)
    with pytest.raises(backend.conflict):
        await store.add_join_token(JoinTokenRecord("t1", "sealed:second", 2.0, 200.0, "eve"))
    assert await store.get_join_token("t1") == first


# --------------------------------------------------------------------------- nodes


async def test_nodes_enroll_register_and_states(store: Store) -> None:
    await store.enroll_node("n1", "111", 1.0)
    node = await store.get_node("n1")
    assert node is not None and node.state == "NotReady" and node.facts is None
    await store.register_node("n1", "10.0.0.5", "0.1", {"cpu_count": 4}, 2.0)
    node = await store.get_node("n1")
    assert node is not None
    assert (node.state, node.address, node.facts) == ("Ready", "10.0.0.5", {"cpu_count": 4})
    await store.set_node_states([("n1", "NotReady", "missed 3 heartbeats", 9.0)])
    node = await store.get_node("n1")
    assert node is not None and (node.state, node.state_reason, node.last_seen) == (
        "NotReady",
        "missed 3 heartbeats",
        9.0,
    )
    # The replicas its agent reports Ready: none until written, then as written.
    assert node.replicas == []
    served = [{"replica_id": "m.default.a1", "state": "ready", "port": 8001}]
    await store.set_node_replicas([("n1", served)])
    await store.set_node_replicas([])
    node = await store.get_node("n1")
    assert node is not None and node.replicas == served
    # Enrolling again replaces the certificate and keeps what is known of the node.
    await store.enroll_node("n1", "222", 3.0)
    node = await store.get_node("n1")
    assert node is not None and node.cert_serial == "222" and node.facts == {"cpu_count": 4}
    assert [n.id for n in await store.list_nodes()] == ["n1"]
    await store.audit("admin", "node.enroll", "n1", "x")
    assert (await store.audit_log())[0]["target"] == "n1"


async def test_an_enrolled_node_is_kept_whole(store: Store) -> None:
    assert await store.get_node("n1") is None
    assert await store.list_nodes() == []
    await store.enroll_node("n1", "0xab", 1.5)
    node = await store.get_node("n1")
    assert node is not None
    assert (node.id, node.cert_serial, node.enrolled_at) == ("n1", "0xab", 1.5)
    assert (node.state, node.state_reason) == ("NotReady", "enrolled, not yet connected")
    assert (node.address, node.version, node.registered_at, node.last_seen) == (
        None,
        "",
        None,
        None,
    )
    assert (node.cordoned, node.draining, node.labels) == (False, False, {})
    # Re-enrolling moves the enrolment time with the certificate.
    await store.enroll_node("n1", "0xcd", 7.0)
    node = await store.get_node("n1")
    assert node is not None and (node.cert_serial, node.enrolled_at) == ("0xcd", 7.0)


async def test_nodes_are_listed_by_id(store: Store) -> None:
    for nid in ("n3", "n1", "n2"):
        await store.enroll_node(nid, f"serial-{nid}", 1.0)
    nodes = await store.list_nodes()
    assert [n.id for n in nodes] == ["n1", "n2", "n3"]
    assert [n.cert_serial for n in nodes] == ["serial-n1", "serial-n2", "serial-n3"]


async def test_nodes_register_in_one_batch(store: Store) -> None:
    await store.enroll_node("n1", "1", 1.0)
    await store.enroll_node("n2", "2", 1.0)
    await store.register_nodes(
        [
            ("n1", "10.0.0.1", "0.2", {"cards": [{"index": 0, "memory": 80}]}, 5.0),
            ("n2", None, "0.3", {}, 6.0),
            ("ghost", "10.0.0.9", "0.2", {"x": 1}, 7.0),  # never enrolled: not created
        ]
    )
    n1, n2 = await store.list_nodes()
    assert (n1.state, n1.state_reason, n1.address, n1.version) == ("Ready", "", "10.0.0.1", "0.2")
    assert n1.facts == {"cards": [{"index": 0, "memory": 80}]}
    assert (n1.registered_at, n1.last_seen) == (5.0, 5.0)
    assert (n2.state, n2.address, n2.version, n2.registered_at) == ("Ready", None, "0.3", 6.0)
    assert n2.facts is None  # nothing reported reads back as no facts
    assert await store.get_node("ghost") is None
    await store.register_nodes([])  # nothing to write is not an error
    assert [n.id for n in await store.list_nodes()] == ["n1", "n2"]


async def test_a_node_registering_again_replaces_what_it_said(store: Store) -> None:
    await store.enroll_node("n1", "1", 1.0)
    await store.register_node("n1", "10.0.0.1", "0.1", {"cpu_count": 4, "old": True}, 2.0)
    await store.set_node_states([("n1", "NotReady", "agent gone", None)])
    await store.register_node("n1", "10.0.0.2", "0.2", {"cpu_count": 8}, 9.0)
    node = await store.get_node("n1")
    assert node is not None
    assert (node.state, node.state_reason, node.address, node.version) == (
        "Ready",
        "",
        "10.0.0.2",
        "0.2",
    )
    assert node.facts == {"cpu_count": 8}
    assert (node.registered_at, node.last_seen) == (9.0, 9.0)


async def test_node_states_are_written_together(store: Store) -> None:
    for nid in ("n1", "n2", "n3"):
        await store.enroll_node(nid, nid, 1.0)
        await store.register_node(nid, None, "0.1", {}, 2.0)
    await store.set_node_states(
        [
            ("n1", "NotReady", "missed 3 heartbeats", 8.0),
            ("n2", "NotReady", "agent closed the session", None),  # last seen kept
            ("ghost", "Ready", "", 9.0),  # unknown: ignored, not created
        ]
    )
    n1, n2, n3 = await store.list_nodes()
    assert (n1.state, n1.state_reason, n1.last_seen) == ("NotReady", "missed 3 heartbeats", 8.0)
    assert (n2.state, n2.state_reason, n2.last_seen) == (
        "NotReady",
        "agent closed the session",
        2.0,
    )
    assert (n3.state, n3.state_reason, n3.last_seen) == ("Ready", "", 2.0)
    assert await store.get_node("ghost") is None
    await store.set_node_states([])
    assert [n.state for n in await store.list_nodes()] == ["NotReady", "NotReady", "Ready"]


async def test_node_scheduling_is_kept_with_its_audit_entry(store: Store) -> None:
    await store.enroll_node("n1", "1", 1.0)
    await store.enroll_node("n2", "2", 1.0)
    labels = {"zone": "b", "gpu": "h200"}
    await store.set_node_scheduling("n1", True, True, labels, Audit("admin", "node.drain", "n1"))
    n1, n2 = await store.list_nodes()
    assert (n1.cordoned, n1.draining, n1.labels) == (True, True, labels)
    assert (n2.cordoned, n2.draining, n2.labels) == (False, False, {})  # the other untouched
    assert await audits(store) == [("admin", "node.drain", "n1", "")]
    # Registering, state changes and a new certificate leave scheduling as it was.
    await store.register_node("n1", "10.0.0.1", "0.1", {"cpu_count": 2}, 3.0)
    await store.set_node_states([("n1", "NotReady", "gone", 4.0)])
    await store.enroll_node("n1", "9", 5.0)
    kept = await store.get_node("n1")
    assert kept is not None and (kept.cordoned, kept.draining, kept.labels) == (True, True, labels)
    await store.set_node_scheduling(
        "n1", False, False, {}, Audit("admin", "node.uncordon", "n1", "by hand")
    )
    back = await store.get_node("n1")
    assert back is not None and (back.cordoned, back.draining, back.labels) == (False, False, {})
    assert await audits(store) == [
        ("admin", "node.uncordon", "n1", "by hand"),
        ("admin", "node.drain", "n1", ""),
    ]


# -------------------------------------------------------------------------- models


async def test_models_are_kept_by_name_with_their_audit_entries(store: Store) -> None:
    assert await store.list_models() == []
    spec_b = {"source": "hf:org/b", "profiles": [{"name": "fast", "ctx": 4096}], "replicas": 2}
    spec_a = {"source": "file:/m/a.gguf", "labels": {"team": "x"}, "nested": {"ok": [1, 2.5]}}
    before = time.time()
    await store.put_model("b", spec_b, Audit("admin", "model.put", "b", "created"))
    await store.put_model("a", spec_a, Audit("ops", "model.put", "a"))
    after = time.time()
    a, b = await store.list_models()
    assert (a.name, a.spec, b.name, b.spec) == ("a", spec_a, "b", spec_b)
    for m in (a, b):
        assert before <= m.created_at == m.updated_at <= after
    assert await audits(store) == [
        ("ops", "model.put", "a", ""),
        ("admin", "model.put", "b", "created"),
    ]


async def test_a_model_put_again_is_replaced_and_keeps_its_creation(store: Store) -> None:
    await store.put_model("m", {"source": "v1", "old": True}, Audit("admin", "model.put", "m"))
    (first,) = await store.list_models()
    await store.put_model("m", {"source": "v2"}, Audit("admin", "model.put", "m", "v2"))
    (second,) = await store.list_models()
    assert second.spec == {"source": "v2"}  # replaced, not merged
    assert second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    assert [a[3] for a in await audits(store)] == ["v2", ""]


async def test_a_model_is_deleted_once(store: Store) -> None:
    await store.put_model("a", {"source": "a"}, Audit("admin", "model.put", "a"))
    await store.put_model("b", {"source": "b"}, Audit("admin", "model.put", "b"))
    assert await store.delete_model("a", Audit("admin", "model.delete", "a")) is True
    assert [m.name for m in await store.list_models()] == ["b"]
    # Deleting what is not there says so and is not audited: nothing changed.
    assert await store.delete_model("a", Audit("admin", "model.delete", "a", "again")) is False
    assert await store.delete_model("zz", Audit("admin", "model.delete", "zz")) is False
    assert await audits(store) == [
        ("admin", "model.delete", "a", ""),
        ("admin", "model.put", "b", ""),
        ("admin", "model.put", "a", ""),
    ]


# -------------------------------------------------------------------- gateway keys


def key(kid: str, created_at: float) -> ApiKeyRecord:
    return ApiKeyRecord(kid, f"owner-{kid}", f"sha256:{kid}", created_at=created_at)


async def test_api_keys_round_trip_in_order_of_creation(store: Store) -> None:
    assert await store.list_api_keys() == []
    full = ApiKeyRecord(
        "k2",
        "team-a",
        "sha256:aa",
        models=("llama", "qwen"),
        rpm=60,
        tpm=10_000,
        budget=5_000_000,
        expires_at=2_000_000_000.5,
        created_at=20.0,
    )
    bare = key("k1", 10.0)
    await store.add_api_key(full, Audit("admin", "key.add", "k2", "team-a"))
    await store.add_api_key(bare, Audit("admin", "key.add", "k1"))
    await store.add_api_key(key("k3", 30.0), Audit("admin", "key.add", "k3"))
    assert await store.list_api_keys() == [bare, full, key("k3", 30.0)]
    assert (bare.models, bare.rpm, bare.expires_at, bare.revoked_at) == ((), None, None, None)
    assert [a[2] for a in await audits(store)] == ["k3", "k1", "k2"]


async def test_an_api_key_is_revoked_once(store: Store) -> None:
    await store.add_api_key(key("k1", 1.0), Audit("admin", "key.add", "k1"))
    await store.add_api_key(key("k2", 2.0), Audit("admin", "key.add", "k2"))
    assert await store.revoke_api_key("k1", 50.0, Audit("admin", "key.revoke", "k1")) is True
    # A second revocation keeps the first time and is not audited.
    assert await store.revoke_api_key("k1", 60.0, Audit("admin", "key.revoke", "k1")) is False
    assert await store.revoke_api_key("nope", 60.0, Audit("admin", "key.revoke", "nope")) is False
    k1, k2 = await store.list_api_keys()
    assert (k1.id, k1.revoked_at) == ("k1", 50.0)
    assert (k2.id, k2.revoked_at) == ("k2", None)
    assert [a[1:3] for a in await audits(store)] == [
        ("key.revoke", "k1"),
        ("key.add", "k2"),
        ("key.add", "k1"),
    ]


async def test_an_api_key_keeps_its_priority_and_it_may_change(store: Store) -> None:
    first = ApiKeyRecord("k1", "batch", "sha256:k1", created_at=1.0, priority=-5)
    await store.add_api_key(first, Audit("admin", "key.add", "k1"))
    await store.add_api_key(key("k2", 2.0), Audit("admin", "key.add", "k2"))
    assert [k.priority for k in await store.list_api_keys()] == [-5, 0]
    audit = Audit("admin", "key.update", "k2", "priority 7")
    assert await store.set_api_key_priority("k2", 7, audit) is True
    assert await store.set_api_key_priority("nope", 7, audit) is False
    assert [k.priority for k in await store.list_api_keys()] == [-5, 7]
    assert (await audits(store))[0] == ("admin", "key.update", "k2", "priority 7")
    assert [a[1] for a in await audits(store)].count("key.update") == 1


async def test_an_api_key_hash_or_id_is_taken_once(store: Store, backend: Backend) -> None:
    await store.add_api_key(key("k1", 1.0), Audit("admin", "key.add", "k1"))
    same_hash = ApiKeyRecord("k2", "other", "sha256:k1", created_at=2.0)
    with pytest.raises(backend.conflict):
        await store.add_api_key(same_hash, Audit("admin", "key.add", "k2"))
    same_id = ApiKeyRecord("k1", "other", "sha256:new", created_at=3.0)
    with pytest.raises(backend.conflict):
        await store.add_api_key(same_id, Audit("admin", "key.add", "k1", "again"))
    assert await store.list_api_keys() == [key("k1", 1.0)]
    # The refused adds left no audit entry: each is written with its change or not at all.
    assert await audits(store) == [("admin", "key.add", "k1", "")]


async def test_tool_grants_and_guard_policies_round_trip_on_keys_and_levels(
    store: Store,
) -> None:
    # None (says nothing), () (closed) and a list are three different things.
    says_nothing = ApiKeyRecord("k1", "a", "sha256:k1", created_at=1.0)
    closed = ApiKeyRecord("k2", "b", "sha256:k2", created_at=2.0, tools=(), guard=("pii",))
    granted = ApiKeyRecord("k3", "c", "sha256:k3", created_at=3.0, tools=("jira.*", "wiki.get"))
    for record in (says_nothing, closed, granted):
        await store.add_api_key(record, Audit("admin", "key.add", record.id))
    assert await store.list_api_keys() == [says_nothing, closed, granted]
    assert [k.tools for k in await store.list_api_keys()] == [None, (), ("jira.*", "wiki.get")]
    org = Org("o1", "lab", Limits(rpm=5, tools=("jira.*",), guard=("pii", "inj")), 1.0)
    team = Team("t1", "o1", "vision", Limits(tools=()), 1.0)
    project = Project("j1", "o1", "t1", "demo", Limits(guard=("pii",)), 1.0)
    await store.directory.change([org, team, project], [], Audit("admin", "org.create", "lab"))
    assert [o for o in await store.directory.all(Org) if o.id == "o1"] == [org]
    assert [t for t in await store.directory.all(Team) if t.id == "t1"] == [team]
    assert [p for p in await store.directory.all(Project) if p.id == "j1"] == [project]


async def test_limits_of_keys_and_levels_are_set_together_each_audited(store: Store) -> None:
    await store.add_api_key(key("k1", 1.0), Audit("admin", "key.add", "k1"))
    org = Org("o1", "lab", Limits(tools=("jira.*", "wiki.*")), 1.0)
    await store.directory.put(org, Audit("admin", "org.create", "lab"))
    keyed = ApiKeyRecord(
        "k1", "ignored", "sha256:ignored", ("q*",), 7, 8, 9, tools=(), guard=("pii",)
    )
    opened = Org("o1", "lab", Limits(tools=("wiki.*",)), 1.0)
    await store.set_limits(
        [
            (opened, Audit("ops", "org.limits", "lab", "tools wiki.*")),
            (keyed, Audit("ops", "key.limits", "k1", "tools closed")),
        ]
    )
    (k1,) = await store.list_api_keys()
    # The limits changed; the key's name, hash and creation are as they were.
    assert (k1.name, k1.key_hash, k1.created_at) == ("owner-k1", "sha256:k1", 1.0)
    assert (k1.models, k1.rpm, k1.tpm, k1.budget, k1.tools, k1.guard) == (
        ("q*",),
        7,
        8,
        9,
        (),
        ("pii",),
    )
    assert [o for o in await store.directory.all(Org) if o.id == "o1"] == [opened]
    assert [a[1:4] for a in (await audits(store))[:2]] == [
        ("key.limits", "k1", "tools closed"),
        ("org.limits", "lab", "tools wiki.*"),
    ]


async def test_limits_set_together_are_all_or_nothing(store: Store, backend: Backend) -> None:
    await store.add_api_key(key("k1", 1.0), Audit("admin", "key.add", "k1"))
    closed = ApiKeyRecord("k1", "owner-k1", "sha256:k1", created_at=1.0, tools=())
    broken = Team("t9", "o1", None, Limits(tools=()))  # type: ignore[arg-type]
    with pytest.raises(backend.conflict):
        await store.set_limits(
            [
                (closed, Audit("ops", "key.limits", "k1")),
                (broken, Audit("ops", "team.limits", "t9")),
            ]
        )
    # The key's change and both audit entries went with the step that failed.
    assert await store.list_api_keys() == [key("k1", 1.0)]
    assert [a[1] for a in await audits(store)] == ["key.add"]


# --------------------------------------------------------------------------- usage


async def test_usage_adds_up_per_day_key_model_and_replica(store: Store) -> None:
    assert await store.usage("2000-01-01") == []
    await store.add_usage(
        [
            ("2025-03-02", "k1", "llama", "r1", 1, 10, 20),
            ("2025-03-01", "k2", "llama", "r1", 2, 5, 6),
            ("2025-03-02", "k1", "llama", "r2", 1, 1, 1),
        ]
    )
    await store.add_usage(
        [
            ("2025-03-02", "k1", "llama", "r1", 3, 100, 200),  # adds to the first row
            ("2025-03-03", "k1", "qwen", "r9", 1, 0, 0),
        ]
    )
    await store.add_usage([])  # nothing to add is not an error
    rows = await store.usage("2025-03-01")
    assert rows == [
        {
            "day": "2025-03-01",
            "key_id": "k2",
            "model": "llama",
            "replica": "r1",
            "requests": 2,
            "prompt_tokens": 5,
            "completion_tokens": 6,
        },
        {
            "day": "2025-03-02",
            "key_id": "k1",
            "model": "llama",
            "replica": "r1",
            "requests": 4,
            "prompt_tokens": 110,
            "completion_tokens": 220,
        },
        {
            "day": "2025-03-02",
            "key_id": "k1",
            "model": "llama",
            "replica": "r2",
            "requests": 1,
            "prompt_tokens": 1,
            "completion_tokens": 1,
        },
        {
            "day": "2025-03-03",
            "key_id": "k1",
            "model": "qwen",
            "replica": "r9",
            "requests": 1,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        },
    ]
    # From a day on, that day included.
    assert [r["day"] for r in await store.usage("2025-03-02")] == [
        "2025-03-02",
        "2025-03-02",
        "2025-03-03",
    ]
    assert await store.usage("2025-03-04") == []


# --------------------------------------------------------------------------- audit


# ------------------------------------------------------------------ control planes


def server(name: str, serial: str, at: float) -> ServerRecord:
    return ServerRecord(name, serial, f"{name}:8080", f"{name}:8443", f"{name}:8444", joined_at=at)


async def test_control_planes_are_kept_by_name_removed_once_and_rejoin(store: Store) -> None:
    assert await store.list_servers() == []
    await store.put_server(server("b", "2", 2.0), Audit("admin", "server.join", "b"))
    await store.put_server(server("a", "1", 1.0), Audit("admin", "server.join", "a"))
    assert [s.name for s in await store.list_servers()] == ["a", "b"]
    assert await store.remove_server("b", 5.0, Audit("admin", "server.remove", "b")) is True
    assert await store.remove_server("b", 6.0, Audit("admin", "server.remove", "b")) is False
    assert await store.remove_server("zz", 6.0, Audit("admin", "server.remove", "zz")) is False
    a, b = await store.list_servers()
    assert (a.removed_at, b.removed_at) == (None, 5.0)
    # Joining again under the same name takes the new certificate and clears the removal.
    await store.put_server(server("b", "9", 7.0), Audit("admin", "server.join", "b"))
    b = (await store.list_servers())[1]
    assert (b.cert_serial, b.joined_at, b.removed_at, b.peer_address) == ("9", 7.0, None, "b:8444")
    assert [x[1:3] for x in await audits(store)] == [
        ("server.join", "b"),
        ("server.remove", "b"),
        ("server.join", "a"),
        ("server.join", "b"),
    ]


# ------------------------------------------------------- signed-out page sessions


async def test_a_signed_out_session_is_kept_until_it_would_have_ended(store: Store) -> None:
    assert await store.revoked_sessions(0.0) == {}
    out = Audit("admin@10.0.0.7", "admin.sign_out", "/admin")
    assert await store.revoke_session("s1", 1000.5, 10.0, out) is True
    assert await store.revoke_session("s2", 2000.25, 11.0, out) is True
    # Signed out twice (two tabs, or a standby's and the leader's): kept once, audited once.
    assert await store.revoke_session("s1", 1000.5, 12.0, out) is False
    assert await store.revoked_sessions(0.0) == {"s1": 1000.5, "s2": 2000.25}
    # A session past its end is refused anyway: it is not handed back.
    assert await store.revoked_sessions(1000.5) == {"s2": 2000.25}
    assert [x[1:3] for x in await audits(store)] == [
        ("admin.sign_out", "/admin"),
        ("admin.sign_out", "/admin"),
    ]


async def test_signing_out_drops_the_sessions_that_have_ended(store: Store) -> None:
    out = Audit("admin", "admin.sign_out", "/admin")
    await store.revoke_session("old", 100.0, 50.0, out)
    await store.revoke_session("older", 90.0, 50.0, out)
    await store.revoke_session("later", 500.0, 60.0, out)
    # The list stays small: a sign-out at 100 removes what ended by then, and only that.
    await store.revoke_session("new", 900.0, 100.0, out)
    assert await store.revoked_sessions(0.0) == {"later": 500.0, "new": 900.0}


async def test_the_audit_trail_is_newest_first_and_limited(store: Store) -> None:
    assert await store.audit_log() == []
    before = time.time()
    await store.audit("admin", "token.create", "t1", "expires in 1h")
    await store.audit("ops", "node.enroll", "n1")
    await store.audit("admin", "node.remove", "n1", "by hand")
    after = time.time()
    log = await store.audit_log()
    assert [(a["actor"], a["action"], a["target"], a["detail"]) for a in log] == [
        ("admin", "node.remove", "n1", "by hand"),
        ("ops", "node.enroll", "n1", ""),
        ("admin", "token.create", "t1", "expires in 1h"),
    ]
    assert all(before <= a["at"] <= after for a in log)
    assert [a["at"] for a in log] == sorted((a["at"] for a in log), reverse=True)
    assert len({a["id"] for a in log}) == 3
    assert await audits(store, limit=2) == [
        ("admin", "node.remove", "n1", "by hand"),
        ("ops", "node.enroll", "n1", ""),
    ]
    assert await store.audit_log(limit=0) == []


async def test_the_audit_trail_is_read_by_organisation_actor_and_time(store: Store) -> None:
    """``ctl audit --org --person --since``: each filter alone and together, newest first."""
    await store.put_model("m1", {}, Audit("ann", "org.create", "vision", org="o1"))
    await store.put_model("m2", {}, Audit("admin@10.0.0.5", "key.create", "k1", org="o1"))
    await store.put_model("m3", {}, Audit("ann", "org.create", "text", org="o2"))
    await store.audit("reconciler", "model.park", "tiny")
    log = await store.audit_log()
    assert [a["org_id"] for a in log] == [None, "o2", "o1", "o1"]

    def seen(rows: list[dict[str, object]]) -> list[tuple[object, object]]:
        return [(a["actor"], a["target"]) for a in rows]

    assert seen(await store.audit_log(org_id="o1")) == [("admin@10.0.0.5", "k1"), ("ann", "vision")]
    assert seen(await store.audit_log(actor="ann")) == [("ann", "text"), ("ann", "vision")]
    assert seen(await store.audit_log(org_id="o1", actor="ann")) == [("ann", "vision")]
    assert seen(await store.audit_log(org_id="o1", limit=1)) == [("admin@10.0.0.5", "k1")]
    third = log[1]["at"]
    assert isinstance(third, float)
    assert seen(await store.audit_log(since=third)) == [("reconciler", "tiny"), ("ann", "text")]
    assert await store.audit_log(since=third + 3600) == []
    assert await store.audit_log(org_id="o3") == []
