"""Routing by vLLM's KV events: the index of each replica's blocks, the router's choice
against the blocks each holds, and the reasons counted."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from llmgw.server.gateway import kvroute
from llmgw.server.gateway import router as gw
from llmgw.server.gateway.blockhash import block_hashes
from llmgw.server.gateway.metrics import routing_lines
from llmgw.server.gateway.router import Endpoint, Router
from llmgw.wire.messages import KV_HASH_SEED, KvBlocks

SIZE = 16
SYSTEM = list(range(1000, 1064))  # a shared system prompt: four blocks
PROMPT = SYSTEM + list(range(5000, 5040))  # then the user's turn: two more full blocks


def fleet(**shards: list[str]) -> Any:
    """Nodes, each running the named replicas (what the registry's views hold)."""
    nodes = {
        n: SimpleNamespace(id=n, address=None, shards={r: None for r in rids})
        for n, rids in shards.items()
    }
    return SimpleNamespace(version=1, nodes=nodes, models={}, answers=lambda rid: True)


def router(nodes: Any, *endpoints: Endpoint) -> Router:
    g = Router(nodes, nodes, nodes, b"secret")
    g._table = {"m": list(endpoints)}
    g._version = (1, 1, 1)
    return g


def ep(name: str, node: str, outstanding: int = 0) -> Endpoint:
    e = Endpoint(name, f"http://{name}/v1", "k", 0, outstanding)
    e.node, e.kv = node, True
    return e


def hashes(tokens: list[int]) -> dict[int, list[int]]:
    return kvroute.prompt_hashes(tokens, {SIZE})


def stored(replica: str, tokens: list[int], reset: bool = False) -> KvBlocks:
    return KvBlocks(replica, SIZE, added=block_hashes(tokens, SIZE, KV_HASH_SEED), reset=reset)


def test_a_prompt_goes_to_the_replica_holding_most_of_its_leading_blocks() -> None:
    a, b, c = ep("a", "n1"), ep("b", "n2"), ep("c", "n3")
    g = router(fleet(n1=["a"], n2=["b"], n3=["c"]), a, b, c)
    g.kv_blocks("n1", stored("a", SYSTEM[:32]))  # two of the system prompt's blocks
    g.kv_blocks("n2", stored("b", PROMPT))  # all six
    g.kv_blocks("n3", stored("c", list(range(64))))  # another prompt altogether
    assert g.kv.leading("a", hashes(PROMPT)) == 2
    assert g.kv.leading("b", hashes(PROMPT)) == 6
    assert g.kv.leading("c", hashes(PROMPT)) == 0
    assert g.pick("m", blocks=hashes(PROMPT)) is b
    # A prompt sharing only the system prompt: b and a both hold some, b more (four).
    other = SYSTEM + list(range(7000, 7032))
    assert g.pick("m", blocks=hashes(other)) is b
    assert g.decisions == {("m", gw.KV_EVENTS): 2} and g.kv_hits == {"m": 2}


def test_the_share_held_is_weighed_against_load_per_slot() -> None:
    a, b = ep("a", "n1", outstanding=4), ep("b", "n2")
    a.slots = b.slots = 4
    g = router(fleet(n1=["a"], n2=["b"]), a, b)
    g.kv_blocks("n1", stored("a", PROMPT))  # all six blocks
    g.kv_blocks("n2", stored("b", SYSTEM))  # four of six
    # a: 6/6 - 0.75 x 4/4; b: 4/6 - 0: b, for the system prompt it holds.
    assert g.pick("m", blocks=hashes(PROMPT)) is b
    assert g.decisions == {("m", gw.KV_EVENTS): 1}
    a.outstanding = 1  # 1 - 0.75 x 1/4 beats 4/6: the whole prompt wins
    assert g.pick("m", blocks=hashes(PROMPT)) is a
    # Every slot of both taken but one of b's: a holding all still loses to b.
    a.outstanding, b.outstanding = 8, 1
    assert g.pick("m", blocks=hashes(PROMPT)) is b


def test_a_busy_holder_loses_to_an_idle_replica_holding_nothing() -> None:
    a, b = ep("a", "n1", outstanding=2), ep("b", "n2")  # one slot each: a queues two
    a.slots = b.slots = 1
    g = router(fleet(n1=["a"], n2=["b"]), a, b)
    g.kv_blocks("n1", stored("a", PROMPT))
    assert g.pick("m", blocks=hashes(PROMPT)) is b
    assert g.decisions == {("m", gw.LEAST_OUTSTANDING): 1} and g.kv_hits == {}


def test_a_gap_in_the_chain_stops_the_count() -> None:
    a = ep("a", "n1")
    g = router(fleet(n1=["a"]), a)
    chain = block_hashes(PROMPT, SIZE, KV_HASH_SEED)
    g.kv_blocks("n1", KvBlocks("a", SIZE, added=[chain[0], chain[2], chain[3]]))
    assert g.kv.leading("a", hashes(PROMPT)) == 1  # block 1 was evicted: the rest is moot


def test_net_changes_removals_and_reset() -> None:
    a = ep("a", "n1")
    g = router(fleet(n1=["a"]), a)
    chain = block_hashes(PROMPT, SIZE, KV_HASH_SEED)
    g.kv_blocks("n1", KvBlocks("a", SIZE, added=chain))
    g.kv_blocks("n1", KvBlocks("a", SIZE, removed=chain[4:]))
    assert g.kv.leading("a", hashes(PROMPT)) == 4
    # A reset (a new stream, or events lost): what was known goes, the copy stays.
    g.kv_blocks("n1", KvBlocks("a", SIZE, added=chain[:1], reset=True))
    assert g.kv.held("a") is not None and g.kv.held("a").blocks == {chain[0]}  # type: ignore[union-attr]


def test_a_node_cannot_speak_for_another_nodes_replica() -> None:
    a = ep("a", "n1")
    g = router(fleet(n1=["a"], n2=[]), a)
    g.kv_blocks("n2", stored("a", PROMPT))
    assert g.kv.held("a") is None and g.kv.refused == 1
    assert g.pick("m", blocks=hashes(PROMPT)) is a
    assert g.decisions == {("m", gw.ONLY_REPLICA): 1}


def test_replicas_that_do_not_report_are_never_scored_by_events() -> None:
    a, b = ep("a", "n1"), ep("b", "n2")
    b.kv = False  # a llama.cpp replica of the same model, say
    g = router(fleet(n1=["a"], n2=["b"]), a, b)
    g.kv_blocks("n2", stored("b", PROMPT))
    assert g.kv_sizes("m") == set()  # the only reporting replica has said nothing yet
    a.outstanding = 1
    assert g.pick("m", blocks=hashes(PROMPT)) is b
    assert g.decisions == {("m", gw.LEAST_OUTSTANDING): 1}


def test_replicas_no_node_runs_are_forgotten_when_the_table_is_rebuilt() -> None:
    nodes = fleet(n1=["a"])
    g = Router(nodes, nodes, nodes, b"secret")
    g.kv_blocks("n1", stored("a", PROMPT))
    nodes.nodes["n1"].shards.clear()
    nodes.version = 2
    g.table()
    assert g.kv.held("a") is None


def test_approximate_routing_names_its_reason() -> None:
    a, b = ep("a", "n1"), ep("b", "n2")
    a.kv = b.kv = False
    g = router(fleet(n1=["a"], n2=["b"]), a, b)
    prefix = gw.prompt_prefix({"prompt": "You are a careful assistant. " * 60})
    a.remember(prefix)
    a.outstanding = 1
    assert g.pick("m", prefix=prefix) is a
    assert g.decisions == {("m", gw.APPROXIMATE): 1} and g.prefix_hits == {"m": 1}


def test_the_tokenize_request_keeps_the_chat_and_its_template_switches() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "temperature": 0.3,
    }
    assert kvroute.tokenize_body(body) == {
        "model": "m",
        "messages": body["messages"],
        "add_generation_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert kvroute.tokenize_body({"model": "m", "prompt": "once"}) == {
        "model": "m",
        "prompt": "once",
    }
    assert kvroute.tokenize_body({"model": "m", "input": "x"}) is None
    huge = {"model": "m", "prompt": "x" * (kvroute.TOKENIZE_MAX_CHARS + 1)}
    assert kvroute.tokenize_body(huge) is None


def test_metrics_say_why() -> None:
    text = "\n".join(
        routing_lines({("m", "kv_events"): 3}, {"m": 3}, {("m", "m.default.a1"): 42}, 1)
    )
    assert 'llmgw_router_decisions_total{model="m",reason="kv_events"} 3' in text
    assert 'llmgw_router_kv_hits_total{model="m"} 3' in text
    assert 'llmgw_router_kv_blocks{model="m",replica="m.default.a1"} 42' in text
    assert "llmgw_router_tokenize_failures_total 1" in text


def test_a_breaker_open_replica_holding_the_prompt_is_passed_over() -> None:
    a, b = ep("a", "n1"), ep("b", "n2")
    g = router(fleet(n1=["a"], n2=["b"]), a, b)
    g.kv_blocks("n1", stored("a", PROMPT))
    a.open_until = time.monotonic() + 10
    assert g.pick("m", blocks=hashes(PROMPT)) is b


def test_an_adapters_blocks_are_its_own() -> None:
    # vLLM hashes a LoRA request's blocks with (lora_name,) as extra keys: the same
    # prompt under an adapter holds none of the model's cache, nor the reverse.
    plain = kvroute.prompt_hashes(PROMPT, {SIZE})
    says = kvroute.prompt_hashes(PROMPT, {SIZE}, "says")
    assert set(plain[SIZE]).isdisjoint(says[SIZE])
    assert says[SIZE] == block_hashes(PROMPT, SIZE, KV_HASH_SEED, ("says",))
    a = ep("a", "n1")
    g = router(fleet(n1=["a"]), a)
    g.kv_blocks("n1", stored("a", PROMPT))
    assert g.kv.leading("a", plain) == 6 and g.kv.leading("a", says) == 0
