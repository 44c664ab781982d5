"""vLLM's block hashes, on vectors computed by vLLM's published rules.

The rules (vllm/v1/core/kv_cache_utils.py ``init_none_hash``, ``hash_block_tokens``,
``maybe_convert_block_hash``; vllm/utils/hashing.py ``sha256_cbor``)::

    NONE_HASH = sha256(cbor2.dumps(PYTHONHASHSEED, canonical=True)).digest()
    h_i = sha256(cbor2.dumps((h_{i-1} or NONE_HASH, tuple(block_tokens), extra_keys),
                             canonical=True)).digest()
    published = int.from_bytes(h_i, "big") & (2**64 - 1)

The vectors below were computed with those lines, cbor2 5.x and hashlib, outside
llmgw's code; cbor2 (a test dependency) checks our CBOR writer on more inputs.
"""

from __future__ import annotations

import hashlib

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.server.gateway import blockhash

# PYTHONHASHSEED "0": NONE_HASH, and tokens 1..40 in blocks of 16 (two full blocks).
ROOT_0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
DIGESTS_1_TO_40 = [
    "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea",
    "4a0a393805c6d2f0ed831000d41bb65980336c4c04895d5e26470bbec927f5bf",
]
PUBLISHED_1_TO_40 = [3236607068019569386, 2758186210834249151]
# The same tokens for a LoRA request whose adapter is "sql": extra_keys ("sql",).
PUBLISHED_1_TO_40_LORA_SQL = [7268285685236462265, 16136184774607115083]
# PYTHONHASHSEED "12345", a chat prompt's token ids (Qwen's ids), blocks of 4.
CHAT_TOKENS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644]
CHAT_TOKENS += [872, 198, 9707, 0]
PUBLISHED_CHAT_12345 = [
    13795359235197612328,
    8693013835425882644,
    2754593679028519873,
    9531331516931339723,
]


def test_the_chain_root_is_the_seed_hashed() -> None:
    assert blockhash.root("0").hex() == ROOT_0


def test_full_digests_chain_over_the_blocks_before() -> None:
    tokens = list(range(1, 41))
    digests = blockhash.block_digests(tokens, 16, "0")
    assert [d.hex() for d in digests] == DIGESTS_1_TO_40  # the last 8 tokens: no block


def test_published_hashes_are_the_low_64_bits() -> None:
    assert blockhash.block_hashes(list(range(1, 41)), 16, "0") == PUBLISHED_1_TO_40


def test_extra_keys_change_every_block() -> None:
    tokens = list(range(1, 41))
    assert blockhash.block_hashes(tokens, 16, "0", ("sql",)) == PUBLISHED_1_TO_40_LORA_SQL


def test_large_token_ids_and_another_seed() -> None:
    assert blockhash.block_hashes(CHAT_TOKENS, 4, "12345") == PUBLISHED_CHAT_12345


def test_a_prompt_shorter_than_a_block_has_no_hash() -> None:
    assert blockhash.block_hashes([1, 2, 3], 16, "0") == []


def test_a_shared_prefix_shares_its_leading_hashes() -> None:
    a = blockhash.block_hashes(list(range(64)), 16, "0")
    b = blockhash.block_hashes([*range(48), *range(100, 116)], 16, "0")
    assert a[:3] == b[:3] and a[3] != b[3]


def test_bad_block_size_is_refused() -> None:
    with pytest.raises(ValueError, match="block size"):
        blockhash.block_hashes([1, 2], 0, "0")


def test_types_outside_the_subset_are_refused() -> None:
    with pytest.raises(TypeError, match="float"):
        blockhash.cbor(1.5)


cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.binary(max_size=300)
    | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=30).map(tuple),
    max_leaves=60,
)


# Nested values are slow to draw on a busy machine: the check is of the encoding, not
# of how fast Hypothesis draws.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(cbor_values)
def test_cbor_matches_cbor2_canonical(value: object) -> None:
    assert blockhash.cbor(value) == cbor2.dumps(value, canonical=True)


@given(st.lists(st.integers(min_value=0, max_value=2**31), max_size=80), st.integers(1, 20))
def test_block_hashes_match_the_rules_written_with_cbor2(tokens: list[int], size: int) -> None:
    parent = hashlib.sha256(cbor2.dumps("7", canonical=True)).digest()
    want = []
    for start in range(0, len(tokens) - size + 1, size):
        block = (parent, tuple(tokens[start : start + size]), None)
        parent = hashlib.sha256(cbor2.dumps(block, canonical=True)).digest()
        want.append(int.from_bytes(parent, "big") & (2**64 - 1))
    assert blockhash.block_hashes(tokens, size, "7") == want
