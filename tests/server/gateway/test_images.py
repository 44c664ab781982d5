"""A chat request's image parts: data: URLs checked, http(s) URLs fetched only where the
model allows, a model without vision refused, and the body changed only by a fetch."""

from __future__ import annotations

import base64
import copy
import os
import struct
import zlib

import pytest

from llmgw.jsonvalue import JSONObject
from llmgw.server.gateway.checks import Bounds, Rejected, check
from llmgw.server.gateway.images import (
    MAX_IMAGES,
    ImageRules,
    decode_data_url,
    image_parts,
    media_type_of,
    prepare_images,
)


def png(side: int = 4, noise: bool = False) -> bytes:
    """A real PNG, ``side`` square: red pixels, or random ones (which do not compress)."""
    row = (lambda: os.urandom(3 * side)) if noise else (lambda: b"\xc8\x32\x32" * side)
    raw = b"".join(b"\x00" + row() for _ in range(side))

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


def data(media: str, payload: bytes) -> str:
    return f"data:{media};base64,{base64.b64encode(payload).decode()}"


def chat(*urls: str) -> JSONObject:
    parts: list[JSONObject] = [{"type": "text", "text": "what is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": u, "detail": "low"}} for u in urls]
    return {"model": "eye", "messages": [{"role": "user", "content": parts}]}


RULES = ImageRules(model="eye", vision=True, allow_urls=False, max_bytes=4096)


class Fetcher:
    def __init__(self, answer: tuple[str, bytes] = ("image/png", b"")) -> None:
        self.answer = answer
        self.asked: list[str] = []

    async def __call__(self, url: str) -> tuple[str, bytes]:
        self.asked.append(url)
        return self.answer


async def refused(body: JSONObject, rules: ImageRules = RULES) -> Rejected:
    with pytest.raises(Rejected) as info:
        await prepare_images(body, rules, Fetcher())
    return info.value


async def test_a_data_url_of_a_real_image_passes_unchanged() -> None:
    body = chat(data("image/png", png()))
    before = copy.deepcopy(body)
    fetch = Fetcher()
    assert await prepare_images(body, RULES, fetch) is False
    assert body == before and fetch.asked == []


async def test_text_only_requests_are_not_looked_at_even_for_a_model_without_vision() -> None:
    body: JSONObject = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    rules = ImageRules(model="m", vision=False, allow_urls=False)
    assert await prepare_images(body, rules, Fetcher()) is False


async def test_a_model_without_vision_is_refused_an_image_naming_the_model() -> None:
    exc = await refused(chat(data("image/png", png())), ImageRules("plain", False, False))
    assert exc.code == "model_not_vision" and exc.param == "messages"
    assert "'plain' does not take images" in exc.message and "mmproj" in exc.message


async def test_a_model_whose_replicas_have_not_said_lets_images_pass() -> None:
    rules = ImageRules(model="eye", vision=None, allow_urls=False)
    assert await prepare_images(chat(data("image/png", png())), rules, Fetcher()) is False


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        ("data:text/plain;base64,aGVsbG8=", "invalid_image", "text/plain is not an image"),
        ("data:image/svg+xml;base64,PHN2Zy8+", "invalid_image", "image/svg+xml is not"),
        ("data:image/png,rawbytes", "invalid_image", "must be base64"),
        ("data:image/png;base64,@@not base64@@", "invalid_image", "does not decode"),
        (data("image/png", b"\xff\xd8\xff\xe0jpeg"), "invalid_image", "a image/jpeg file"),
        (data("image/png", b"plain text"), "invalid_image", "no image llmgw knows"),
        (data("image/png", png(64)[:8] + b"\x00" * 5000), "image_too_large", "4096 bytes"),
        ("data:;base64,AAAA", "invalid_image", "not a data URL"),
        ("file:///etc/passwd", "invalid_image", "data:image/...;base64"),
        ("ftp://example.com/a.png", "invalid_image", "not 'ftp://"),
    ],
)
async def test_a_bad_image_is_refused_naming_where_and_why(url: str, code: str, words: str) -> None:
    exc = await refused(chat(data("image/png", png()), url))
    assert exc.code == code, exc.message
    assert exc.message.startswith("messages[0].content[2]: ")
    assert words in exc.message


async def test_an_image_part_without_a_url_is_refused() -> None:
    body = chat()
    body["messages"][0]["content"].append({"type": "image_url", "image_url": "x"})  # type: ignore[index, union-attr]
    exc = await refused(body)
    assert exc.code == "invalid_image" and '"image_url": {"url"' in exc.message


async def test_a_url_is_refused_unless_the_model_allows_fetching() -> None:
    exc = await refused(chat("https://example.com/cat.png"))
    assert exc.code == "image_url_not_allowed"
    assert "'eye' does not fetch image URLs" in exc.message
    assert "--allow-image-urls" in exc.message and "data: URL" in exc.message


async def test_an_allowed_url_is_fetched_and_passed_on_as_a_data_url() -> None:
    image = png()
    fetch = Fetcher(("image/png", image))
    body = chat("https://example.com/cat.png")
    rules = ImageRules(model="eye", vision=True, allow_urls=True)
    assert await prepare_images(body, rules, fetch) is True
    assert fetch.asked == ["https://example.com/cat.png"]
    part = body["messages"][0]["content"][1]  # type: ignore[index]
    assert part == {
        "type": "image_url",
        "image_url": {"url": data("image/png", image), "detail": "low"},
    }


async def test_a_fetched_answer_that_is_no_image_is_refused() -> None:
    rules = ImageRules(model="eye", vision=True, allow_urls=True)
    with pytest.raises(Rejected, match="not the image/png it says"):
        await prepare_images(chat("https://x/a.png"), rules, Fetcher(("image/png", b"<html>")))


async def test_at_most_max_images_parts() -> None:
    exc = await refused(chat(*[data("image/png", png())] * (MAX_IMAGES + 1)))
    assert exc.code == "too_many_images"


def test_the_signatures_of_each_type() -> None:
    assert media_type_of(png()) == "image/png"
    assert media_type_of(b"GIF89a...") == "image/gif"
    assert media_type_of(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert media_type_of(b"RIFF\x00\x00\x00\x00WAVEfmt ") is None
    assert media_type_of(b"BM\x00\x00") == "image/bmp"
    assert decode_data_url(data("IMAGE/PNG", png()), "x", 4096)[0] == "image/png"


def test_images_are_not_counted_as_prompt_characters() -> None:
    """A 200 KB image in a request held to 1,024 prompt characters passes the prompt
    check: its bytes are the image cap's to judge, not the prompt's."""
    url = data("image/png", png(256, noise=True))
    assert len(url) > 200_000
    body = chat(url)
    assert check("chat", body, Bounds(max_prompt_chars=1024)) == "eye"
    assert [where for where, _ in image_parts(body)] == ["messages[0].content[1]"]
