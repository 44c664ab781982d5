"""Fetching a chat request's image URL for a model that allows it, without letting a
client reach what the control plane can reach and it cannot (SSRF).

The rules, each a 400 naming the URL and the rule:

- ``http`` or ``https`` only, no user or password in the URL;
- every address the host resolves to must be public (global unicast): loopback,
  link-local (the cloud metadata address among them), private, shared, multicast,
  reserved and unspecified addresses are refused, IPv4 in IPv6 judged as its IPv4;
  ``gateway: image_urls_private: true`` in server.yaml allows them (an operator whose
  images live on the internal network);
- the connection goes to the address that was checked (the check is the connector's
  resolver), so a name that resolves once public and then private gains nothing;
- a redirect is followed (at most ``MAX_REDIRECTS``) only to the same host, and is
  checked as the first hop was; to another host it is refused;
- the answer must be 200 with an image media type, at most ``max_bytes`` (refused from
  its Content-Length, else once the body passes it), within ``timeout`` seconds;
- no proxy from the environment, no cookies kept.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from llmgw.server.gateway.checks import Rejected

MAX_REDIRECTS = 3
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 16


def address_problem(address: str, allow_private: bool) -> str | None:
    """Why an image URL's host address is refused (in words), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified or ip.is_multicast:
        return f"{ip} is an unspecified or multicast address"
    if allow_private or ip.is_global:
        return None
    if ip.is_loopback:
        kind = "loopback"
    elif ip.is_link_local:
        kind = "link-local"
    elif ip.is_private:
        kind = "private"
    else:
        kind = "reserved"
    return (
        f"{ip} is a {kind} address; image URLs go only to public addresses "
        "(gateway: image_urls_private: true in server.yaml allows others)"
    )


class CheckedResolver(AbstractResolver):
    """Resolves as the system does, and refuses a host with any address the rules
    refuse; the connector connects only to what this returned."""

    def __init__(self, allow_private: bool) -> None:
        self.allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, family=socket.AF_UNSPEC
            )
        except OSError as exc:
            raise Rejected(
                f"the image URL's host {host} does not resolve: {exc}", "image_fetch_failed"
            ) from None
        out: list[ResolveResult] = []
        for fam, _, proto, _, sockaddr in infos:
            address = str(sockaddr[0])
            problem = address_problem(address, self.allow_private)
            if problem is not None:
                raise Rejected(
                    f"the image URL's host {host} is refused: {problem}",
                    "image_url_refused",
                    "messages",
                )
            out.append(
                {
                    "hostname": host,
                    "host": address,
                    "port": int(sockaddr[1]),
                    "family": fam,
                    "proto": proto,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        return out

    async def close(self) -> None:
        return None


class ImageFetcher:
    """The gateway's one client for image URLs (``images.prepare_images``' ``fetch``)."""

    def __init__(self, max_bytes: int, timeout: float, allow_private: bool = False) -> None:
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.allow_private = allow_private
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=CheckedResolver(self.allow_private), use_dns_cache=False, limit=64
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                trust_env=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __call__(self, url: str) -> tuple[str, bytes]:
        """(media type, bytes) of the image at ``url``; Rejected naming why not."""
        target = _checked_url(url, self.allow_private)
        first = target
        try:
            async with asyncio.timeout(self.timeout):
                for _ in range(MAX_REDIRECTS + 1):
                    async with self._client().get(target, allow_redirects=False) as resp:
                        if resp.status in _REDIRECTS:
                            location = resp.headers.get("Location")
                            target = _next_hop(first, target, location, self.allow_private)
                            continue
                        return await self._body(url, resp)
        except TimeoutError:
            raise Rejected(
                f"the image at {url[:200]} did not arrive within {self.timeout:g} s",
                "image_fetch_failed",
                "messages",
            ) from None
        except aiohttp.ClientError as exc:
            raise Rejected(
                f"the image at {url[:200]} could not be fetched: {type(exc).__name__}: {exc}",
                "image_fetch_failed",
                "messages",
            ) from None
        raise Rejected(
            f"the image at {url[:200]} redirects more than {MAX_REDIRECTS} times",
            "image_fetch_failed",
            "messages",
        )

    async def _body(self, url: str, resp: aiohttp.ClientResponse) -> tuple[str, bytes]:
        where = f"the image at {url[:200]}"
        if resp.status != 200:
            raise Rejected(f"{where} answered HTTP {resp.status}", "image_fetch_failed", "messages")
        media = resp.content_type.lower()
        if not media.startswith("image/"):
            raise Rejected(
                f"{where} is {media or 'of no media type'}, not an image",
                "invalid_image",
                "messages",
            )
        length = resp.content_length
        if length is not None and length > self.max_bytes:
            raise _too_large(where, self.max_bytes)
        data = bytearray()
        while chunk := await resp.content.read(_CHUNK):
            data += chunk
            if len(data) > self.max_bytes:
                raise _too_large(where, self.max_bytes)
        return media, bytes(data)


def _too_large(where: str, limit: int) -> Rejected:
    return Rejected(
        f"{where} is over the {limit} bytes one image may be", "image_too_large", "messages"
    )


def _checked_url(url: str, allow_private: bool) -> URL:
    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise Rejected(
            f"{url[:200]!r} is not an http(s) URL with a host", "invalid_image", "messages"
        )
    if parsed.user is not None or parsed.password is not None:
        raise Rejected(
            "an image URL may not carry a user or password", "image_url_refused", "messages"
        )
    host = parsed.host.strip("[]")
    if _is_ip(host):
        # aiohttp connects to an address literal without asking the resolver: judged here.
        problem = address_problem(host, allow_private)
        if problem is not None:
            raise Rejected(
                f"the image URL's host is refused: {problem}", "image_url_refused", "messages"
            )
    return parsed


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _next_hop(first: URL, current: URL, location: str | None, allow_private: bool) -> URL:
    """Where a redirect points, when it is the same host as the URL the client gave."""
    if not location:
        raise Rejected(
            f"the image at {first} redirects without a Location", "image_fetch_failed", "messages"
        )
    target = _checked_url(str(current.join(URL(location))), allow_private)
    if (target.host or "").lower() != (first.host or "").lower():
        raise Rejected(
            f"the image at {first} redirects to another host ({target.host}); image URLs "
            "follow redirects only on their own host: give the final address",
            "image_url_refused",
            "messages",
        )
    return target
