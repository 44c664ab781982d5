"""Routing by what the engines' KV caches hold, from vLLM's own KV events.

A model with ``kv_events: true`` runs vLLM publishing its cache's changes (blocks
stored, removed, all cleared); each node's agent mirrors them per replica and sends
the net changes up its stream (``KvBlocks``), a whole copy on every new stream. The
control plane keeps them here, for the sending node's own replicas only: a report
about a replica the node does not run is not believed.

To route a request the gateway asks one replica's ``/tokenize`` for the prompt's
tokens (the chat template applied as for the request), hashes its full blocks as vLLM
does (``blockhash.py``) and counts, per replica, the leading blocks it holds: the
prefill it would skip. The router weighs that against load (``router.py``). Any step
that fails (no report yet, a tokenizer that does not answer in time) falls back to
the approximate prefix guess, never to an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from llmgw.jsonvalue import JSONObject
from llmgw.server.gateway import blockhash
from llmgw.wire.messages import KV_HASH_SEED, KvBlocks

log = logging.getLogger("llmgw.gateway")

# The tokenizer must answer quickly or the request goes on without it.
TOKENIZE_TIMEOUT = 1.0
# Prompts longer than this (characters) are not tokenized for routing.
TOKENIZE_MAX_CHARS = 400_000


@dataclass
class Held:
    """One replica's cache as its node reported it."""

    node: str
    block_size: int
    blocks: set[int] = field(default_factory=set)
    updates: int = 0

    def leading(self, chain: Sequence[int]) -> int:
        """How many of ``chain``'s blocks, from its first, this cache holds."""
        n = 0
        for h in chain:
            if h not in self.blocks:
                break
            n += 1
        return n


class KvIndex:
    """Every vLLM replica's cached blocks (64-bit hashes), by replica id."""

    def __init__(self) -> None:
        self.replicas: dict[str, Held] = {}
        self.refused = 0

    def apply(self, node_id: str, msg: KvBlocks, runs: bool = True) -> None:
        """A node's report; ``runs``: whether that node runs the replica (else it is
        dropped: one node cannot speak for another's replicas)."""
        if not runs:
            self.refused += 1
            return
        held = self.replicas.get(msg.replica_id)
        if msg.reset or held is None or held.node != node_id:
            held = self.replicas[msg.replica_id] = Held(node_id, msg.block_size)
        if msg.block_size > 0:
            held.block_size = msg.block_size
        held.blocks.difference_update(msg.removed)
        held.blocks.update(msg.added)
        held.updates += 1

    def keep_only(self, replica_ids: Iterable[str]) -> None:
        """Forget replicas no node runs any more."""
        keep = set(replica_ids)
        for rid in [r for r in self.replicas if r not in keep]:
            del self.replicas[rid]

    def held(self, replica_id: str) -> Held | None:
        return self.replicas.get(replica_id)

    def leading(self, replica_id: str, hashes: Mapping[int, Sequence[int]]) -> int:
        """How many of a prompt's leading blocks ``replica_id`` holds (0 if unknown).
        ``hashes``: the prompt's block hashes by block size."""
        held = self.replicas.get(replica_id)
        return held.leading(hashes.get(held.block_size, ())) if held is not None else 0

    def block_sizes(self, replica_ids: Iterable[str]) -> set[int]:
        return {
            h.block_size for r in replica_ids if (h := self.replicas.get(r)) and h.block_size > 0
        }


def prompt_hashes(
    tokens: Sequence[int], block_sizes: Iterable[int], adapter: str | None = None
) -> dict[int, list[int]]:
    """A prompt's block hashes for each block size its replicas use. A request for a
    LoRA adapter hashes its blocks with the adapter's name, as vLLM does
    (``extra_keys``: ``(lora_name,)``), so its cache is never taken for the model's."""
    extra = (adapter,) if adapter else None
    return {size: blockhash.block_hashes(tokens, size, KV_HASH_SEED, extra) for size in block_sizes}


def tokenize_body(body: JSONObject) -> JSONObject | None:
    """What vLLM's ``/tokenize`` takes for this request: its messages with the chat
    template applied as for an answer, or its prompt; None when there is nothing to
    tokenize cheaply."""
    model = body.get("model")
    messages = body.get("messages")
    if isinstance(messages, list):
        out: JSONObject = {"model": model, "messages": messages}
        out["add_generation_prompt"] = body.get("add_generation_prompt", True)
        for passed in ("chat_template_kwargs", "tools", "continue_final_message"):
            if passed in body:
                out[passed] = body[passed]
        size = len(json.dumps(messages))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        out = {"model": model, "prompt": prompt}
        size = len(prompt)
    return out if size <= TOKENIZE_MAX_CHARS else None


async def tokenize(
    session: aiohttp.ClientSession, url: str, key: str, request: Mapping[str, object]
) -> list[int] | None:
    """The prompt's token ids from the replica at ``url`` (its ``/v1`` base), or None."""
    base = url[:-3] if url.endswith("/v1") else url
    try:
        async with session.post(
            base + "/tokenize",
            json=request,
            headers={"Authorization": f"Bearer {key}"},
            timeout=aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT),
        ) as resp:
            if resp.status != 200:
                return None
            answer = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("tokenize at %s: %s", base, exc)
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens


async def prompt_tokens(
    session: aiohttp.ClientSession, url: str, key: str, engine: str, body: JSONObject
) -> int | None:
    """How many tokens a chat request's prompt is, by the replica at ``url`` (its
    ``/v1`` base), counted as its engine counts a request's ``prompt_tokens``: the chat
    template applied as for an answer, special tokens added; None when it cannot say.
    llama.cpp renders the template (``/apply-template``) and counts the text with its
    BOS (``add_special``); vLLM and SGLang tokenize the messages themselves."""
    if engine != "llama.cpp":
        request = tokenize_body(body)
        tokens = await tokenize(session, url, key, request) if request is not None else None
        return None if tokens is None else len(tokens)
    messages = body.get("messages")
    if not isinstance(messages, list) or len(json.dumps(messages)) > TOKENIZE_MAX_CHARS:
        return None
    rendered: JSONObject = {"messages": messages}
    if "chat_template_kwargs" in body:
        rendered["chat_template_kwargs"] = body["chat_template_kwargs"]
    base = url[:-3] if url.endswith("/v1") else url
    try:
        async with session.post(
            base + "/apply-template",
            json=rendered,
            headers={"Authorization": f"Bearer {key}"},
            timeout=aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT),
        ) as resp:
            answer = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("apply-template at %s: %s", base, exc)
        return None
    prompt = answer.get("prompt") if isinstance(answer, dict) else None
    if not isinstance(prompt, str):
        return None
    request = {"content": prompt, "add_special": True, "parse_special": True}
    tokens = await tokenize(session, url, key, request)
    return None if tokens is None else len(tokens)
