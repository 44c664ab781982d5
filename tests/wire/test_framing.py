"""Frames without sockets: split anywhere, joined anywhere, refused when broken."""

from __future__ import annotations

import struct

import msgpack
import pytest

from llmgw.wire import MAX_FRAME, FrameDecoder, FrameError, encode_frame


def test_round_trip_split_at_every_byte() -> None:
    frames = [encode_frame({"t": "a", "n": i, "blob": b"\x00" * i}) for i in range(5)]
    stream = b"".join(frames)
    for cut in range(len(stream) + 1):
        dec = FrameDecoder()
        out = dec.feed(stream[:cut]) + dec.feed(stream[cut:])
        assert [f["n"] for f in out] == list(range(5))
        assert dec.pending == 0


def test_one_byte_at_a_time_and_header_layout() -> None:
    frame = encode_frame({"t": "x"})
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert msgpack.unpackb(frame[4:]) == {"t": "x"}
    dec = FrameDecoder()
    got = [f for b in frame for f in dec.feed(bytes([b]))]
    assert got == [{"t": "x"}]


def test_oversized_frame_refused_before_buffering() -> None:
    dec = FrameDecoder(max_frame=100)
    with pytest.raises(FrameError, match="exceeds the 100-byte limit"):
        dec.feed(struct.pack(">I", 101))
    with pytest.raises(FrameError):
        encode_frame({"blob": b"x" * (MAX_FRAME + 1)})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "not a map"),
        # Keys must be strings: a map keyed by numbers is no message of ours.
        (msgpack.packb({1: 2}), "not valid msgpack"),
    ],
)
def test_bad_bodies(body: bytes, message: str) -> None:
    dec = FrameDecoder()
    data = struct.pack(">I", len(body)) + body
    with pytest.raises(FrameError, match=message):
        dec.feed(data)
