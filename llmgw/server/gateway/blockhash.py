"""A prompt's KV-cache block hashes, computed exactly as vLLM computes them.

vLLM (v1 engine, ``--prefix-caching-hash-algo sha256_cbor``) names each full block of
``block_size`` prompt tokens by a hash chained over the blocks before it
(``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``)::

    NONE_HASH = sha256(cbor(PYTHONHASHSEED))                   # the chain's root
    h[0]      = sha256(cbor((NONE_HASH, tuple(tokens[0:B]), extra_keys)))
    h[i]      = sha256(cbor((h[i-1],    tuple(tokens[iB:(i+1)B]), extra_keys)))

where ``cbor`` is ``cbor2.dumps(obj, canonical=True)`` (``vllm/utils/hashing.py``,
``sha256_cbor``), ``PYTHONHASHSEED`` the engine's environment variable as a string, and
``extra_keys`` None for a plain text request (a LoRA request adds ``(lora_name,)``).
Only full blocks are hashed. With ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` the KV events
name a block by the low 64 bits of its digest read big-endian
(``maybe_convert_block_hash``): that is the form returned here.

The CBOR written is the canonical subset those tuples need: byte strings, text, ints,
None, booleans and arrays (a tuple is an array), each head in its shortest form.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache


def _head(major: int, n: int) -> bytes:
    """A CBOR item's head: major type and argument in the shortest form (RFC 8949 4.2.1)."""
    if n < 24:
        return bytes([major << 5 | n])
    if n < 1 << 8:
        return bytes([major << 5 | 24, n])
    if n < 1 << 16:
        return bytes([major << 5 | 25]) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes([major << 5 | 26]) + n.to_bytes(4, "big")
    if n < 1 << 64:
        return bytes([major << 5 | 27]) + n.to_bytes(8, "big")
    raise ValueError(f"an integer past 64 bits ({n}) has no CBOR head")


def cbor(obj: object) -> bytes:
    """``obj`` as canonical CBOR; a type outside the subset vLLM's keys use is refused."""
    out = bytearray()
    _write(obj, out)
    return bytes(out)


def _write(obj: object, out: bytearray) -> None:
    if obj is None:
        out.append(0xF6)
    elif obj is True:
        out.append(0xF5)
    elif obj is False:
        out.append(0xF4)
    elif isinstance(obj, int):
        if obj >= 0:
            out += _head(0, obj)
        else:
            out += _head(1, -1 - obj)
    elif isinstance(obj, bytes | bytearray):
        out += _head(2, len(obj))
        out += obj
    elif isinstance(obj, str):
        data = obj.encode()
        out += _head(3, len(data))
        out += data
    elif isinstance(obj, tuple | list):
        out += _head(4, len(obj))
        for item in obj:
            _write(item, out)
    else:
        raise TypeError(f"no canonical CBOR for {type(obj).__name__} here")


def sha256_cbor(obj: object) -> bytes:
    return hashlib.sha256(cbor(obj)).digest()


@lru_cache(maxsize=16)
def root(seed: str) -> bytes:
    """The hash every chain starts from: vLLM's ``NONE_HASH`` for this PYTHONHASHSEED."""
    return sha256_cbor(seed)


# The CBOR of every token id below 2**18 (every vocabulary in use is smaller), written
# on first use (about 12 MB, only where KV-event routing runs): a block's encoding is
# then lookups and one join.
_TABLE_SIZE = 1 << 18
_uints: list[bytes] = []


def _tokens_cbor(tokens: tuple[int, ...]) -> bytes:
    if not _uints:
        _uints.extend(_head(0, n) for n in range(_TABLE_SIZE))
    if tokens and (min(tokens) < 0 or max(tokens) >= _TABLE_SIZE):
        return b"".join(map(cbor, tokens))
    return b"".join(map(_uints.__getitem__, tokens))


@lru_cache(maxsize=1 << 16)
def _block(parent: bytes, tokens: tuple[int, ...], extra: bytes) -> bytes:
    """One block's digest: sha256 of the canonical CBOR of ``(parent, tokens, extra)``,
    written directly (the same bytes ``cbor`` gives). Remembered: a conversation that
    comes back hashes its history's blocks again."""
    data = b"\x83\x58\x20" + parent + _head(4, len(tokens)) + _tokens_cbor(tokens) + extra
    return hashlib.sha256(data).digest()


def block_digests(
    tokens: Sequence[int],
    block_size: int,
    seed: str,
    extra_keys: tuple[object, ...] | None = None,
) -> list[bytes]:
    """The full digests of each full block of ``tokens``, first block first."""
    if block_size <= 0:
        raise ValueError(f"block size {block_size}: give a positive number of tokens")
    parent = root(seed)
    extra = cbor(extra_keys)
    out: list[bytes] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = _block(parent, tuple(tokens[start : start + block_size]), extra)
        out.append(parent)
    return out


def block_hashes(
    tokens: Sequence[int],
    block_size: int,
    seed: str,
    extra_keys: tuple[object, ...] | None = None,
) -> list[int]:
    """Each full block's hash as vLLM's KV events name it (the digest's low 64 bits)."""
    return [
        int.from_bytes(d[24:], "big") for d in block_digests(tokens, block_size, seed, extra_keys)
    ]
