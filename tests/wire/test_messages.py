"""Messages: absent stays absent, unknowns are ignored, wrong types are refused."""

from __future__ import annotations

import msgpack
import pytest

from llmgw.wire import GPU, Disk, FrameDecoder, Heartbeat, HostFacts, Register, Registered
from llmgw.wire.messages import MessageError, decode_message, encode_message, message_types


def _round(msg: object) -> object:
    (payload,) = FrameDecoder().feed(encode_message(msg))  # type: ignore[arg-type]
    return decode_message(payload)


def test_register_round_trip_with_nested_facts() -> None:
    host = HostFacts(
        hostname="n1",
        os="Debian",
        arch="x86_64",
        cpu_count=8,
        cpu_flags=["avx2"],
        memory_total=64 << 30,
        disks=[
            Disk(path="/", fstype="ext4", total=100, free=40),
            Disk(path="/mnt/nfs", fstype="nfs4", total=1000, free=10, shared=True),
        ],
        gpus=[GPU(index=0, uuid="GPU-1", name="NVIDIA H100", memory_total=80 << 30)],
    )
    msg = Register(node_id="n1", version="0.1", host=host, features=["heartbeat.v1"])
    assert _round(msg) == msg


def test_unknown_figures_travel_as_absent_not_zero() -> None:
    frame = encode_message(Heartbeat(seq=3, memory_available=None, cpu_percent=0.0))
    payload = msgpack.unpackb(frame[4:])
    assert "memory_available" not in payload
    assert payload["cpu_percent"] == 0.0
    beat = decode_message(payload)
    assert isinstance(beat, Heartbeat)
    assert beat.memory_available is None and beat.cpu_percent == 0.0


def test_unknown_fields_and_types_are_ignored() -> None:
    newer = {"t": "registered", "node_id": "n", "heartbeat_interval": 5, "shiny": [1, 2]}
    msg = decode_message(newer)
    assert msg == Registered(node_id="n", heartbeat_interval=5.0)
    assert decode_message({"t": "from-the-future", "x": 1}) is None


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"t": "heartbeat", "seq": "1"}, "Heartbeat.seq: expected int"),
        ({"t": "heartbeat", "seq": True}, "expected int"),
        ({"t": "heartbeat"}, "missing field 'seq'"),
        ({"t": "heartbeat", "seq": 1, "disks": [{"path": "/"}]}, "missing field 'fstype'"),
        ({"t": "heartbeat", "seq": 1, "load": "high"}, "expected a list"),
        ({"t": "register", "node_id": "n", "version": "1", "host": 3}, "expected a map"),
        ({"no": "type"}, "no message type"),
    ],
)
def test_wrong_types_are_refused_with_the_field_named(
    payload: dict[str, object], problem: str
) -> None:
    with pytest.raises(MessageError, match=problem):
        decode_message(payload)


def test_every_type_is_registered_once() -> None:
    types = message_types()
    assert set(types) >= {"register", "heartbeat", "registered", "goodbye"}
    assert all(cls.TYPE == name for name, cls in types.items())
