"""The hub's model listing read from a stand-in answering the hub API's shapes: what is
asked (sort, limit, the expand fields, the GGUF filter, the token), what is read, and a
hub answering garbage said as such."""

from __future__ import annotations

import pytest

from llmgw.modelkit.hub import HubError, HubNotFound
from llmgw.modelkit.hublist import EXPAND, HubListing, repo_from_json
from tests.support.hubstandin import TRENDING, HubStandIn


async def test_the_trending_hundred_is_asked_with_its_fields_and_read() -> None:
    async with HubStandIn() as hub, HubListing(hub.url, "hf_secret", environ={}) as client:
        repos = await client.list_models()
    assert [r.id for r in repos] == [r["id"] for r in TRENDING]
    (asked,) = hub.asked
    assert asked.query["sort"] == "trendingScore"
    assert asked.query["limit"] == "100"
    assert sorted(asked.query.getall("expand")) == sorted(EXPAND)
    assert "filter" not in asked.query
    assert asked.headers["Authorization"] == "Bearer hf_secret"
    by_id = {r.id: r for r in repos}
    qwen = by_id["unsloth/Qwen3-8B-GGUF"]
    assert qwen.gguf is not None and qwen.gguf.total == 8_190_735_360
    assert (qwen.gguf.architecture, qwen.gguf.context_length) == ("qwen3", 40960)
    assert "Qwen3-8B-Q4_K_M.gguf" in qwen.siblings
    awq = by_id["Qwen/Qwen2.5-7B-Instruct-AWQ"]
    assert awq.safetensors is not None
    assert dict(awq.safetensors.parameters) == {"I32": 822_083_584, "F16": 1_089_994_752}
    assert (awq.quant_method, awq.quant_bits) == ("awq", 4)
    assert by_id["meta-llama/Llama-3.1-8B-Instruct"].gated
    assert not qwen.gated
    assert by_id["mlx-community/Qwen3-8B-4bit"].library_name == "mlx"


async def test_a_search_without_cards_asks_for_gguf_only() -> None:
    async with HubStandIn() as hub, HubListing(hub.url, environ={}) as client:
        repos = await client.list_models("qwen3", gguf_only=True, limit=5)
    (asked,) = hub.asked
    assert (asked.query["search"], asked.query["filter"], asked.query["limit"]) == (
        "qwen3",
        "gguf",
        "5",
    )
    assert "Authorization" not in asked.headers
    assert [r.id for r in repos] == ["unsloth/Qwen3-8B-GGUF", "unsloth/Qwen3-30B-A3B-GGUF"]


async def test_a_repository_comes_with_its_files_and_sizes() -> None:
    async with HubStandIn() as hub, HubListing(hub.url, environ={}) as client:
        info, files = await client.repository("unsloth/DeepSeek-R1-GGUF")
        with pytest.raises(HubNotFound, match="no/such"):
            await client.repository("no/such")
    assert info.gguf is not None and info.gguf.total == 671_026_419_200
    parts = [f for f in files if f.path.startswith("Q4_K_M/")]
    assert len(parts) == 11 and all(f.size and f.sha256 for f in parts)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("garbage", "is not JSON .*it began '<html>"),
        ("wrong", "with dict, not a list of repositories"),
    ],
)
async def test_a_hub_answering_garbage_is_said_so(mode: str, said: str) -> None:
    async with HubStandIn(mode) as hub, HubListing(hub.url, environ={}) as client:
        with pytest.raises(HubError, match=said):
            await client.list_models()


def test_fields_of_the_wrong_type_are_absent_not_guessed() -> None:
    repo = repo_from_json(
        {
            "id": "org/m",
            "downloads": "many",
            "gguf": {"total": "8B", "architecture": 7},
            "safetensors": {"parameters": {"BF16": -1}},
            "siblings": [{"rfilename": 3}, "x", {"rfilename": "a.gguf"}],
            "tags": ["gguf", 1],
        }
    )
    assert repo is not None
    assert repo.downloads is None and repo.safetensors is None
    assert repo.gguf is not None and repo.gguf.total is None and repo.gguf.architecture is None
    assert repo.siblings == ("a.gguf",) and repo.tags == ("gguf",)
    for bad in ("no-slash", "../x", "a/b/c", "a/b:Q4_K_M", "a/b?x=1", "a--b/c"):
        assert repo_from_json({"id": bad}) is None, bad
    assert repo_from_json([]) is None


async def test_a_hub_without_a_listing_is_said_to_be_no_hub() -> None:
    async with HubStandIn() as hub, HubListing(f"{hub.url}/mirror/hf", environ={}) as client:
        with pytest.raises(HubError, match="has no model listing .*404.*offline mirror"):
            await client.list_models()
