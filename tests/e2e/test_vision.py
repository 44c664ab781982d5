"""A vision model end to end: a GGUF with its mmproj projector beside it, served by the
real llama-server given --mmproj, asked about an image through the gateway with the
openai SDK; the image reaches the engine (its prompt grows by the image's tokens), the
catalog and /v1/models say the model takes images, and a text model is refused one."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest

from tests.e2e.catalog import ctl_json, join, scheduled, serve, wait_ready
from tests.e2e.cluster import Cluster
from tests.support.tinymodel import write_tiny_model
from tests.support.tinyprojector import IMAGE, IMAGE_TOKENS, write_tiny_projector

pytestmark = pytest.mark.e2e


def png(side: int) -> bytes:
    raw = b"".join(b"\x00" + b"\xc8\x32\x32" * side for _ in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def test_a_vision_model_is_served_with_its_projector_and_answers_an_image(
    cluster: Cluster, binary: Path, model: Path, tmp_path: Path
) -> None:
    eye = tmp_path / "eye"
    eye.mkdir()
    weights = write_tiny_model(eye / "eye-F32.gguf")
    projector = write_tiny_projector(eye / "mmproj-eye-F32.gguf")
    join(cluster, "a", binary)
    serve(cluster, weights, "eye")
    serve(cluster, model, "tiny")  # the text model: no projector beside it
    (row,) = wait_ready(cluster, "eye", 1)
    wait_ready(cluster, "tiny", 1)

    argv = psutil.Process(row["pid"]).cmdline()
    assert argv[argv.index("--mmproj") + 1] == str(projector)
    assert ctl_json(cluster, "model", "show", "eye")["vision"] is True
    assert ctl_json(cluster, "model", "show", "tiny")["vision"] is False

    key = str(ctl_json(cluster, "keys", "create", "--name", "viewer")["key"])
    sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0)
    image = "data:image/png;base64," + base64.b64encode(png(IMAGE)).decode()
    try:
        listing = {m.id: m.to_dict() for m in sdk.models.list()}
        assert listing["eye"]["capabilities"] == ["vision"]
        assert "capabilities" not in listing["tiny"]

        def prompt_tokens(*extra: dict[str, object]) -> int:
            reply = sdk.chat.completions.create(
                model="eye",
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "hello"}, *extra]}  # type: ignore[list-item]
                ],
                max_tokens=2,
            )
            assert reply.usage is not None
            return reply.usage.prompt_tokens

        text = prompt_tokens()
        # The engine read the image: its prompt is longer by the image's tokens.
        seen = prompt_tokens({"type": "image_url", "image_url": {"url": image}})
        assert seen == text + IMAGE_TOKENS

        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(
                model="tiny",
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": image}}],
                    }
                ],
                max_tokens=2,
            )
        assert "'tiny' does not take images" in str(refused.value)
        with pytest.raises(openai.BadRequestError, match="does not fetch image URLs"):
            sdk.chat.completions.create(
                model="eye",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
                        ],
                    }
                ],
                max_tokens=2,
            )
    finally:
        sdk.close()
