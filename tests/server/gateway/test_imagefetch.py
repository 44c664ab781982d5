"""Fetching an image URL: public addresses only unless allowed, redirects only on the
same host, a size cap and a timeout; against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from llmgw.server.gateway.checks import Rejected
from llmgw.server.gateway.imagefetch import ImageFetcher, address_problem

IMAGE = b"\x89PNG\r\n\x1a\n" + b"\x00" * 100


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "127.0.0.1 is a loopback"),  # IPv4 in IPv6, judged as IPv4
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("fe80::1%eth0", "link-local"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("fd00::1", "private"),
        ("100.64.0.1", "reserved"),  # shared address space: not global either
        ("0.0.0.0", "unspecified or multicast"),
        ("224.0.0.1", "unspecified or multicast"),
    ],
)
def test_addresses_that_are_not_public_are_refused(address: str, words: str) -> None:
    problem = address_problem(address, allow_private=False)
    assert problem is not None and words in problem


def test_public_addresses_pass_and_the_operator_may_allow_private_ones() -> None:
    assert address_problem("93.184.216.34", allow_private=False) is None
    assert address_problem("2606:4700::1111", allow_private=False) is None
    assert address_problem("10.1.2.3", allow_private=True) is None
    assert address_problem("127.0.0.1", allow_private=True) is None
    # Never a host's every address nor a group, allowed or not.
    assert address_problem("0.0.0.0", allow_private=True) is not None


class Images:
    """A server on loopback answering the paths the tests ask for; counts requests."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.port = 0
        self.hold = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.path)
        path = request.path
        if path == "/cat.png":
            return web.Response(body=IMAGE, content_type="image/png")
        if path == "/hop":
            raise web.HTTPFound("/cat.png")
        if path == "/away":
            raise web.HTTPFound(f"http://localhost:{self.port}/cat.png")
        if path == "/loop":
            raise web.HTTPFound("/loop")
        if path == "/page":
            return web.Response(text="<html>", content_type="text/html")
        if path == "/big":
            return web.Response(body=IMAGE + b"\x00" * 5000, content_type="image/png")
        if path == "/streamed":
            resp = web.StreamResponse(headers={"Content-Type": "image/png"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(10):
                await resp.write(b"\x00" * 1000)
            await resp.write_eof()
            return resp
        if path == "/slow":
            await self.hold.wait()
        return web.Response(status=404)


@pytest.fixture
async def images() -> AsyncIterator[Images]:
    server = Images()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server
    finally:
        server.hold.set()
        await runner.cleanup()


async def fetched(url: str, *, private: bool = True, timeout: float = 5.0) -> tuple[str, bytes]:
    fetcher = ImageFetcher(max_bytes=4096, timeout=timeout, allow_private=private)
    try:
        return await fetcher(url)
    finally:
        await fetcher.close()


async def refusal(url: str, **kw: object) -> Rejected:
    with pytest.raises(Rejected) as info:
        await fetched(url, **kw)  # type: ignore[arg-type]
    return info.value


async def test_a_loopback_address_is_refused_before_any_request(images: Images) -> None:
    exc = await refusal(f"http://127.0.0.1:{images.port}/cat.png", private=False)
    assert exc.code == "image_url_refused" and "loopback" in exc.message
    assert images.seen == []


async def test_a_name_resolving_to_loopback_is_refused(images: Images) -> None:
    exc = await refusal(f"http://localhost:{images.port}/cat.png", private=False)
    assert exc.code == "image_url_refused"
    assert "host localhost is refused" in exc.message and "loopback" in exc.message
    assert images.seen == []


async def test_allowed_private_addresses_are_fetched(images: Images) -> None:
    assert await fetched(f"http://127.0.0.1:{images.port}/cat.png") == ("image/png", IMAGE)
    assert images.seen == ["/cat.png"]


async def test_a_redirect_on_the_same_host_is_followed(images: Images) -> None:
    assert await fetched(f"http://127.0.0.1:{images.port}/hop") == ("image/png", IMAGE)
    assert images.seen == ["/hop", "/cat.png"]


async def test_a_redirect_to_another_host_is_refused(images: Images) -> None:
    exc = await refusal(f"http://127.0.0.1:{images.port}/away")
    assert exc.code == "image_url_refused"
    assert "redirects to another host (localhost)" in exc.message
    assert images.seen == ["/away"]


async def test_redirects_are_followed_a_few_times_only(images: Images) -> None:
    exc = await refusal(f"http://127.0.0.1:{images.port}/loop")
    assert "redirects more than 3 times" in exc.message
    assert len(images.seen) == 4


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("/page", "invalid_image", "is text/html, not an image"),
        ("/big", "image_too_large", "over the 4096 bytes"),
        ("/streamed", "image_too_large", "over the 4096 bytes"),
        ("/missing", "image_fetch_failed", "answered HTTP 404"),
    ],
)
async def test_what_is_not_a_small_image_is_refused(
    images: Images, path: str, code: str, words: str
) -> None:
    exc = await refusal(f"http://127.0.0.1:{images.port}{path}")
    assert exc.code == code and words in exc.message


async def test_an_image_that_does_not_arrive_in_time_is_refused(images: Images) -> None:
    exc = await refusal(f"http://127.0.0.1:{images.port}/slow", timeout=0.3)
    assert exc.code == "image_fetch_failed" and "within 0.3 s" in exc.message
    assert images.seen == ["/slow"]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://user:pw@example.com/a.png", "user or password"),
        ("gopher://example.com/a.png", "not an http(s) URL"),
        ("http:///a.png", "not an http(s) URL"),
    ],
)
async def test_urls_that_are_not_plain_http_are_refused(url: str, words: str) -> None:
    exc = await refusal(url)
    assert words in exc.message
