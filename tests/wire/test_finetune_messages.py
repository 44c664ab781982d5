"""The fine-tune messages on the wire: a job's spec, its status with losses, and a
stored adapter's pieces (bytes) survive a frame each, and a piece fits the stream's
frame with room to spare."""

from __future__ import annotations

from llmgw.wire import FrameDecoder
from llmgw.wire.codec import from_map, to_map
from llmgw.wire.framing import MAX_FRAME
from llmgw.wire.messages import (
    AdapterAsk,
    AdapterPiece,
    FinetuneSpec,
    FinetuneStatus,
    Message,
    Request,
    decode_message,
    encode_message,
)


def _round(msg: Message) -> Message | None:
    frame = encode_message(msg)
    assert len(frame) < MAX_FRAME
    (payload,) = FrameDecoder().feed(frame)
    return decode_message(payload)


def test_status_ask_and_piece_round_trip() -> None:
    status = FinetuneStatus(id="ft-1", state="training", step=3, loss_at=2, loss=[1.5])
    assert _round(status) == status
    assert _round(AdapterAsk(ask_id="a1", name="tuned", at=1024)) == AdapterAsk("a1", "tuned", 1024)
    piece = AdapterPiece(
        ask_id="a1", name="tuned", at=0, data=bytes(range(256)) * 4096, total=2**21, sha256="ab"
    )
    assert _round(piece) == piece  # 1 MiB of bytes, well inside a frame


def test_a_spec_travels_in_a_requests_args() -> None:
    spec = FinetuneSpec(
        id="ft-1",
        name="tuned",
        model="m",
        base="hf:org/tiny",
        epochs=1,
        rank=8,
        device="cuda",
        data_bytes=10,
        data_sha256="00",
        pairs=2,
        cards=["GPU-a"],
        convert=True,
    )
    sent = _round(Request(id="r1", kind="finetune.start", args={"spec": to_map(spec)}))
    assert isinstance(sent, Request)
    assert from_map(FinetuneSpec, sent.args["spec"]) == spec
