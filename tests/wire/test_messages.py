"""Messages: absent stays absent, unknowns are ignored, wrong types are refused."""

from __future__ import annotations

import msgpack
import pytest

from llmgw.wire import GPU, Disk, FrameDecoder, Heartbeat, HostFacts, Register, Registered
from llmgw.wire.messages import (
    MessageError,
    decode_message,
    encode_message,
    from_map,
    message_types,
    to_map,
)


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


def _card(index: int, **fields: object) -> GPU:
    return GPU(index=index, uuid=f"GPU-{index}", name="NVIDIA H100", **fields)  # type: ignore[arg-type]


def test_the_written_decoder_makes_what_from_map_makes() -> None:
    beat = Heartbeat(
        seq=1,
        memory_available=1 << 30,
        cpu_percent=3.5,
        load=[1.0, 0.5, 0.25],
        disks=[Disk(path="/", fstype="ext4", total=100, free=40, shared=True)],
        gpus=[_card(i, power=650.5, throttle=["sw_power_cap"], mig_mode=False) for i in range(8)],
        ages={"gpus": 1.5},
        unread=["ib_ports"],
    )
    (payload,) = FrameDecoder().feed(encode_message(beat))
    decoded = decode_message(payload)
    assert decoded == beat == from_map(Heartbeat, payload)
    assert isinstance(decoded, Heartbeat) and decoded.gpus is not None
    assert decoded.gpus[0].power == 650.5 and decoded.disks is not None
    assert decoded.disks[0].shared is True
    # A default that is not None is the default when absent, as the class says.
    (payload,) = FrameDecoder().feed(
        encode_message(Heartbeat(seq=2, disks=[Disk("/", "xfs", 1, 1)]))
    )
    again = decode_message(payload)
    assert isinstance(again, Heartbeat) and again.disks == [Disk("/", "xfs", 1, 1, shared=False)]


def test_what_the_written_decoder_does_not_take_as_it_is_is_read_as_before() -> None:
    # An int for a float becomes a float, deep in a card; an unknown field is ignored.
    payload = {"t": "heartbeat", "seq": 1, "gpus": [{**to_map(_card(0)), "power": 600, "x": 1}]}
    beat = decode_message(payload)
    assert isinstance(beat, Heartbeat) and beat.gpus is not None
    assert beat.gpus[0].power == 600.0 and isinstance(beat.gpus[0].power, float)
    # A wrong type deep in a list of cards is named as from_map names it.
    payload["gpus"] = [to_map(_card(0)), {**to_map(_card(1)), "temperature": "hot"}]
    with pytest.raises(MessageError, match=r"Heartbeat\.gpus\[1\]\.temperature: expected int"):
        decode_message(payload)
