"""The gateway's router, windows, usage reading and metrics, without processes."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw.server.gateway import router as gw
from llmgw.server.gateway.limits import Window, seconds_to_next_month
from llmgw.server.gateway.proxy import answer_usage
from llmgw.server.gateway.router import Endpoint, Router, prompt_prefix


def router(*endpoints: Endpoint) -> Router:
    fake: Any = SimpleNamespace(version=1, nodes={}, models={}, answers=lambda rid: True)
    g = Router(fake, fake, fake, b"secret")
    g._table = {"m": sorted(endpoints, key=lambda e: -e.priority)}
    g._version = (1, 1, 1)
    return g


def ep(name: str, priority: int = 0, outstanding: int = 0) -> Endpoint:
    return Endpoint(name, f"http://{name}", "k", priority, outstanding)


def long_chat(system: str, question: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
    }


def test_higher_pool_first_then_least_outstanding() -> None:
    gpu1, gpu2, cpu = ep("gpu1", 10, 3), ep("gpu2", 10, 1), ep("cpu", 0, 0)
    g = router(gpu1, gpu2, cpu)
    assert g.pick("m") is gpu2
    gpu2.open_until = time.monotonic() + 10  # its breaker is open
    assert g.pick("m") is gpu1
    gpu1.open_until = time.monotonic() + 10
    assert g.pick("m") is cpu  # the lower pool only when the higher has none
    assert g.pick("m", exclude=cpu) is None
    assert g.pick("other") is None


def test_a_long_shared_prefix_goes_where_it_was_sent_unless_that_replica_is_much_busier() -> None:
    a, b = ep("a"), ep("b")
    g = router(a, b)
    system = "You are a careful assistant. " * 40  # ~1,200 characters
    first = g.pick("m", prefix=prompt_prefix(long_chat(system, "one")))
    assert first is a  # a tie: the first by order
    a.outstanding = 3  # busier, but within the slack
    again = g.pick("m", prefix=prompt_prefix(long_chat(system, "two")))
    assert again is a and g.prefix_hits == {"m": 1}
    other = g.pick("m", prefix=prompt_prefix(long_chat("Something else entirely. " * 40, "x")))
    assert other is b  # no shared prefix: the least busy
    a.outstanding = 3 + gw.PREFIX_SLACK + 1
    assert g.pick("m", prefix=prompt_prefix(long_chat(system, "three"))) is b


def test_short_prompts_are_not_hashed_and_blocks_nest() -> None:
    assert prompt_prefix({"messages": [{"role": "user", "content": "hi"}]}) == []
    assert prompt_prefix({"input": "x" * 5000}) == []
    one = prompt_prefix({"prompt": "a" * 600 + "b" * 600})
    two = prompt_prefix({"prompt": "a" * 600 + "c" * 600})
    assert len(one) == len(two) == 1200 // gw.PREFIX_BLOCK
    # The same first two blocks, then different: each hash covers all before it.
    assert one[:2] == two[:2] and one[3:] != two[3:]
    e = ep("e")
    e.remember(one)
    assert e.match(one) == len(one) and e.match(two) == 2


class Untouchable(dict[str, Any]):
    """A message that fails if read: what the prefix needs no longer."""

    def get(self, *args: Any) -> Any:
        raise AssertionError("a message past the hashed blocks was read")


class Huge(str):
    """A message's content that only a slice of the leading blocks may be taken of."""

    def __getitem__(self, key: Any) -> str:
        assert isinstance(key, slice) and key.start is None
        assert key.stop <= gw.PREFIX_BLOCK * gw.PREFIX_MAX_BLOCKS
        return str.__getitem__(self, key)

    def __format__(self, spec: str) -> str:
        raise AssertionError("the whole content was copied")


def test_a_long_prompt_is_hashed_in_its_leading_blocks_only() -> None:
    # Hashing reads no more of a prompt than its first PREFIX_MAX_BLOCKS blocks cover, so
    # routing takes the same time for a megabyte as for 16 KiB, and two prompts alike that
    # far are routed alike whatever follows.
    head = "You are a careful assistant. " * 1000  # ~29,000 characters
    chat = {"messages": [{"role": "system", "content": Huge(head + "x" * 1_000_000)}]}
    chat["messages"] += [Untouchable(role="user", content="q")] * 10_000
    hashes = prompt_prefix(chat)
    assert len(hashes) == gw.PREFIX_MAX_BLOCKS
    assert hashes == prompt_prefix(long_chat(head, "another question"))
    assert hashes == prompt_prefix({"messages": [{"role": "system", "content": head}]})
    parts = [{"type": "text", "text": head}, {"type": "text", "text": "z"}]
    listed = {"messages": [{"role": "system", "content": parts + [Untouchable()] * 10_000}]}
    assert prompt_prefix(listed) == hashes  # content given as parts: the same text
    completion = prompt_prefix({"prompt": head + "y" * 1_000_000})
    assert len(completion) == gw.PREFIX_MAX_BLOCKS
    assert completion == prompt_prefix({"prompt": head})
    # Shorter than the cap, every whole block counts as before.
    assert len(prompt_prefix({"prompt": "a" * 5000})) == 5000 // gw.PREFIX_BLOCK


def test_a_prompt_is_hashed_only_where_there_is_a_replica_to_choose() -> None:
    chat = long_chat("You are a careful assistant. " * 40, "one")
    alone = router(ep("a"))
    assert alone.prefix_of("m", chat) == [] and alone.prefix_of("nothing", chat) == []
    pair = router(ep("a"), ep("b"))
    assert pair.prefix_of("m", chat) == prompt_prefix(chat) != []


def test_prefix_memory_is_bounded() -> None:
    e = ep("e")
    e.remember(list(range(gw.PREFIX_MEMORY + 10)))
    assert len(e.prefixes) == gw.PREFIX_MEMORY and 0 not in e.prefixes


def test_window_counts_the_last_minute_and_says_when_there_is_room() -> None:
    w = Window()
    w.add(1000.0, 3)
    w.add(1030.5, 2)
    assert w.count(1031) == 5
    assert w.retry_after(1031, 5) == 29  # the first 3 leave at 1060
    assert w.count(1060) == 2
    assert w.count(1091) == 0


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"usage": {"prompt_tokens": 7, "completion_tokens": 3}}', (7, 3)),
        (b'{"usage": {"prompt_tokens": 4, "total_tokens": 4}}', (4, 0)),
        (b'{"choices": []}', (0, 0)),
        (b'not json but has "usage"', (0, 0)),
    ],
)
def test_usage_from_an_answer(data: bytes, expected: tuple[int, int]) -> None:
    assert answer_usage(data) == expected


def test_budget_resets_at_the_next_month() -> None:
    # 2026-12-31 23:59:00 UTC: one minute to January.
    assert seconds_to_next_month(1798761540.0) == 60


def test_engine_metrics_are_relabelled_and_families_said_once() -> None:
    from llmgw.enginefamilies import EngineFamilies

    text = (
        "# HELP llamacpp:tokens_total Tokens.\n# TYPE llamacpp:tokens_total counter\n"
        'llamacpp:tokens_total 12\nvllm:running{engine="0"} 1\n\n'
    )
    families = EngineFamilies()
    families.add(text, "m", "m.default.1")
    families.add(text, "m", "m.default.2")
    # Each family once, its samples from every replica together, under its Prometheus
    # name; the family with no HELP or TYPE is untyped, with a HELP that says so.
    assert families.lines() == [
        "# HELP llamacpp_tokens_total Tokens. (named llamacpp:tokens_total by the engine)",
        "# TYPE llamacpp_tokens_total counter",
        'llamacpp_tokens_total{model="m",replica="m.default.1"} 12',
        'llamacpp_tokens_total{model="m",replica="m.default.2"} 12',
        "# HELP vllm_running The engine gave no help text. (named vllm:running by the engine)",
        "# TYPE vllm_running untyped",
        'vllm_running{model="m",replica="m.default.1",engine="0"} 1',
        'vllm_running{model="m",replica="m.default.2",engine="0"} 1',
    ]


def test_gateway_metrics_render_histograms_and_error_types() -> None:
    from llmgw.server.gateway.metrics import Metrics

    m = Metrics()
    m.request("tiny", 200, 0.02, 0.004)
    m.request("tiny", 429, 0.001, None)
    m.add_tokens("tiny", 10, 3)
    text = m.render({("tiny", "tiny.default.1"): 2}, {"tiny": 5})
    assert 'llmgw_request_seconds_bucket{model="tiny",le="0.025"} 1' in text
    assert 'llmgw_request_seconds_bucket{model="tiny",le="0.01"} 0' in text
    assert 'llmgw_time_to_first_token_seconds_bucket{model="tiny",le="0.005"} 1' in text
    assert 'llmgw_errors_total{model="tiny",type="rate_limit_error"} 1' in text
    assert 'llmgw_tokens_total{model="tiny",kind="prompt"} 10' in text
    assert 'llmgw_replica_inflight{model="tiny",replica="tiny.default.1"} 2' in text
    assert 'llmgw_router_prefix_hits_total{model="tiny"} 5' in text
