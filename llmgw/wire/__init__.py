"""The agent stream's language: message dataclasses and their framing, with no IO.

Both the control plane and the agent import this package and nothing of each other.
The admin API's answers, which the control plane writes and the client and console
read, are typed shapes in ``llmgw.wire.admin``.
"""

from __future__ import annotations

from llmgw.wire.framing import MAX_FRAME, FrameDecoder, FrameError, encode_frame
from llmgw.wire.hardware import GPU, Disk, HostFacts
from llmgw.wire.messages import (
    Heartbeat,
    Message,
    Register,
    Registered,
    decode_message,
    encode_message,
    message_types,
)

__all__ = [
    "GPU",
    "MAX_FRAME",
    "Disk",
    "FrameDecoder",
    "FrameError",
    "Heartbeat",
    "HostFacts",
    "Message",
    "Register",
    "Registered",
    "decode_message",
    "encode_frame",
    "encode_message",
    "message_types",
]
