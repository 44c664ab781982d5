"""Images in a chat request: OpenAI's ``image_url`` content parts, checked before any
engine sees them.

A part is ``{"type": "image_url", "image_url": {"url": URL, "detail": ...}}`` in a
message's content list. Its URL is:

- a ``data:`` URL, ``data:image/TYPE;base64,DATA``: passed to the engine as it is once
  its media type is an image type llmgw knows (PNG, JPEG, GIF, WebP, BMP), its DATA
  decodes as base64, the bytes begin as that type's files do, and they are at most
  ``max_bytes`` (``gateway: image_max_bytes``);
- an ``http(s)://`` URL: fetched by the gateway (``imagefetch.py``: its size cap,
  timeout and address rules) only for a model served with ``allow_image_urls``, and
  passed on as a data: URL, so no engine ever fetches anything; refused otherwise;
- anything else: refused.

A model whose replicas all say they take no images is refused any image part (400
naming the model). While none of its replicas has said (an on-demand model at zero),
the parts pass and the replica that starts answers for itself. vLLM's and SGLang's
multimodal models get the parts as they came (a fetched URL excepted).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmgw.jsonvalue import JSONObject
from llmgw.server.gateway.checks import Rejected

# At most this many image parts in one request: each may cost a fetch and a projector pass.
MAX_IMAGES = 32
DEFAULT_MAX_BYTES = 20 * 2**20
# The first bytes of each image type's files (WebP: "RIFF", four bytes, "WEBP").
_SIGNATURES: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
    "image/bmp": (b"BM",),
}
MEDIA_TYPES = tuple(_SIGNATURES)
_DATA_URL = re.compile(r"^data:(?P<type>[A-Za-z0-9.+/-]+)(?P<params>(?:;[^;,]*)*),", re.ASCII)

# Fetches an http(s) image: (media type, bytes), or Rejected naming why not.
Fetch = Callable[[str], Awaitable[tuple[str, bytes]]]


@dataclass(frozen=True)
class ImageRules:
    """What one model's requests may carry: its replicas' word on images (None: not
    said yet) and whether its image URLs are fetched."""

    model: str
    vision: bool | None
    allow_urls: bool
    max_bytes: int = DEFAULT_MAX_BYTES


def image_parts(body: JSONObject) -> list[tuple[str, JSONObject]]:
    """Every ``image_url`` content part of a chat request's messages, with where it is
    (``messages[0].content[1]``)."""
    parts: list[tuple[str, JSONObject]] = []
    messages = body.get("messages")
    if not isinstance(messages, list):
        return parts
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        parts += [
            (f"messages[{i}].content[{j}]", p)
            for j, p in enumerate(content)
            if isinstance(p, dict) and p.get("type") == "image_url"
        ]
    return parts


def media_type_of(data: bytes) -> str | None:
    """The image type ``data`` begins as, or None."""
    for media, signatures in _SIGNATURES.items():
        if data.startswith(signatures):
            if media == "image/webp" and data[8:12] != b"WEBP":
                continue
            return media
    return None


def check_image(data: bytes, media: str, where: str, max_bytes: int) -> None:
    """Refuse bytes that are not the image ``media`` says, or past ``max_bytes``."""
    if media not in _SIGNATURES:
        raise Rejected(
            f"{where}: {media or 'no media type'} is not an image type llmgw passes "
            f"(it takes {', '.join(MEDIA_TYPES)})",
            "invalid_image",
            "messages",
        )
    if len(data) > max_bytes:
        raise Rejected(
            f"{where}: the image is {len(data)} bytes, over the {max_bytes} bytes one "
            "image may be; send a smaller one",
            "image_too_large",
            "messages",
        )
    found = media_type_of(data)
    if found != media:
        said = f"a {found} file" if found else "no image llmgw knows"
        raise Rejected(
            f"{where}: the data is {said}, not the {media} it says it is",
            "invalid_image",
            "messages",
        )


def decode_data_url(url: str, where: str, max_bytes: int) -> tuple[str, bytes]:
    """(media type, bytes) of a base64 ``data:`` URL, checked; Rejected naming why not."""
    m = _DATA_URL.match(url)
    if m is None:
        raise Rejected(
            f"{where}: not a data URL (data:image/png;base64,...)", "invalid_image", "messages"
        )
    params = [p.strip().lower() for p in m["params"].split(";") if p.strip()]
    if "base64" not in params:
        raise Rejected(
            f"{where}: a data URL's image must be base64 (data:{m['type']};base64,...)",
            "invalid_image",
            "messages",
        )
    encoded = url[m.end() :]
    # Base64 is 4 characters for 3 bytes: a body past this decodes past the cap.
    if len(encoded) > (max_bytes + 2) // 3 * 4 + 4:
        raise Rejected(
            f"{where}: the image is over the {max_bytes} bytes one image may be; send a "
            "smaller one",
            "image_too_large",
            "messages",
        )
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected(
            f"{where}: the data URL's base64 does not decode", "invalid_image", "messages"
        ) from None
    media = m["type"].lower()
    check_image(data, media, where, max_bytes)
    return media, data


def data_url(media: str, data: bytes) -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


async def prepare_images(body: JSONObject, rules: ImageRules, fetch: Fetch) -> bool:
    """Check every image part of ``body``, fetching the http(s) ones the rules allow into
    data URLs in place; True when ``body`` changed. Rejected names the first problem."""
    parts = image_parts(body)
    if not parts:
        return False
    if rules.vision is False:
        raise Rejected(
            f"the model '{rules.model}' does not take images (its replicas run no vision "
            "model: a GGUF model needs an mmproj-*.gguf projector beside it); send text, "
            "or use a vision model",
            "model_not_vision",
            "messages",
        )
    if len(parts) > MAX_IMAGES:
        raise Rejected(
            f"the request has {len(parts)} images, more than the {MAX_IMAGES} one may have",
            "too_many_images",
            "messages",
        )
    changed = False
    for where, part in parts:
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else None
        if not isinstance(image, dict) or not isinstance(url, str):
            raise Rejected(
                f'{where}: an image_url part is {{"type": "image_url", "image_url": '
                '{"url": "data:image/png;base64,..."}}',
                "invalid_image",
                "messages",
            )
        scheme = url[:8].lower()
        if scheme.startswith("data:"):
            decode_data_url(url, where, rules.max_bytes)
        elif scheme.startswith(("http://", "https://")):
            if not rules.allow_urls:
                raise Rejected(
                    f"{where}: the model '{rules.model}' does not fetch image URLs; send the "
                    "image as a data: URL (base64), or have an operator serve the model "
                    "with --allow-image-urls",
                    "image_url_not_allowed",
                    "messages",
                )
            media, data = await fetch(url)
            check_image(data, media, f"{where} ({url[:200]})", rules.max_bytes)
            image["url"] = data_url(media, data)
            changed = True
        else:
            raise Rejected(
                f"{where}: an image URL is data:image/...;base64,... or http(s)://, not "
                f"{url[:40]!r}",
                "invalid_image",
                "messages",
            )
    return changed
