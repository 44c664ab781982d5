"""The Hugging Face hub client (and plain HTTPS downloads) over aiohttp.

Two calls: a repository's file listing with sizes and sha256
(``GET {endpoint}/api/models/{repo}/tree/{rev}?recursive=true``, following the
``Link: rel="next"`` pages), and a download of one file
(``GET {endpoint}/{repo}/resolve/{rev}/{path}``, or any https:// URL) from a byte
offset with ``Range``.

The endpoint is configuration, else ``HF_ENDPOINT``, else https://huggingface.co; the
token is configuration, else ``HF_TOKEN``. The token goes only to the endpoint's own
origin: redirects are followed here rather than by aiohttp so a hop to a CDN or to any
other host never carries it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from llmgw.agent.weights.errors import HubAuthError, HubError, HubNotFound, NetworkError
from llmgw.sources import is_loopback_host

DEFAULT_ENDPOINT = "https://huggingface.co"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10
_MAX_PAGES = 1000


@dataclass(frozen=True)
class HubFile:
    """One file of a repository as the hub lists it; sha256 only for LFS files."""

    path: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Body:
    """An open download. ``offset`` is where its bytes start in the file: the asked
    offset on 206, 0 when the server ignored Range and sent the whole file."""

    status: int
    offset: int
    length: int | None  # bytes in this body, when the server said
    total: int | None  # the whole file's size, when the server said
    _response: aiohttp.ClientResponse
    _host: str

    async def read(self, n: int) -> bytes:
        """Up to n bytes; b"" at the end. A cut or stalled connection is a NetworkError."""
        try:
            return await self._response.content.read(n)
        except aiohttp.ClientPayloadError as exc:
            raise NetworkError(f"connection to {self._host} was cut mid-file: {exc}") from None
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise NetworkError(f"{self._host} stopped sending data (timed out)") from None
        except aiohttp.ClientError as exc:
            raise NetworkError(f"network error reading from {self._host}: {exc}") from None


class HubClient:
    """A Hugging Face compatible hub, and the plain HTTP(S) downloads of URL sources."""

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        allow_http: bool = False,
        connect_timeout: float = 30.0,
        read_timeout: float = 120.0,
    ) -> None:
        env = os.environ if environ is None else environ
        chosen = endpoint or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        self.endpoint = URL(chosen.rstrip("/"))
        if self.endpoint.scheme not in ("http", "https") or not self.endpoint.host:
            raise HubError(f"hub endpoint {chosen!r} must be an http(s):// URL with a host")
        self._token = token or env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None
        # Plain HTTP for URL sources and redirects off loopback; the endpoint itself is
        # the operator's own choice and may be http:// (an internal mirror).
        self.allow_http = allow_http
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_read=read_timeout
        )
        self._session: aiohttp.ClientSession | None = None

    @property
    def has_token(self) -> bool:
        return self._token is not None

    async def __aenter__(self) -> HubClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: a session belongs to the running loop.
        if self._session is None or self._session.closed:
            # Identity encoding throughout: byte offsets for Range must be the file's
            # own, and nothing is decompressed behind our back.
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                auto_decompress=False,
                headers={"User-Agent": "llmgw-agent", "Accept-Encoding": "identity"},
            )
        return self._session

    def _same_origin(self, url: URL) -> bool:
        return _origin(url) == _origin(self.endpoint)

    def _headers(self, url: URL, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self._token and self._same_origin(url):
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def resolve_url(self, repo: str, path: str, revision: str = "main") -> str:
        quoted = quote(path, safe="/")
        return f"{self.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quoted}"

    async def _get(self, url: URL, headers: dict[str, str]) -> aiohttp.ClientResponse:
        try:
            return await self._client().get(
                url, headers=self._headers(url, headers), allow_redirects=False
            )
        except aiohttp.ClientConnectorError as exc:
            raise NetworkError(f"cannot reach {url.host}:{url.port}: {exc.os_error}") from None
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise NetworkError(f"{url.host} did not answer (timed out)") from None
        except aiohttp.ClientError as exc:
            raise NetworkError(f"network error talking to {url.host}: {exc}") from None

    async def _follow(self, url: URL, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """GET, following redirects here so the token never leaves the hub's origin."""
        for _ in range(_MAX_REDIRECTS + 1):
            resp = await self._get(url, headers)
            if resp.status not in _REDIRECTS:
                return resp
            location = resp.headers.get("Location")
            resp.release()
            if not location:
                raise HubError(f"{url.host} answered {resp.status} without a Location")
            target = url.join(URL(location))
            if target.scheme not in ("http", "https"):
                raise HubError(f"{url.host} redirected to a {target.scheme!r} URL; refused")
            if (
                target.scheme == "http"
                and url.scheme == "https"
                and not self.allow_http
                and not is_loopback_host(target.host)
            ):
                raise HubError(
                    f"{url.host} redirected from https to plain http ({target.host}); refused"
                )
            url = target
        raise HubError(f"more than {_MAX_REDIRECTS} redirects fetching {url}")

    async def list_files(self, repo: str, revision: str = "main") -> list[HubFile]:
        """Every file of a repository at a revision, with size and (LFS) sha256."""
        rev = quote(revision, safe="")
        url: URL | None = URL(
            f"{self.endpoint}/api/models/{repo}/tree/{rev}", encoded=True
        ).with_query(recursive="true")
        files: list[HubFile] = []
        pages = 0
        while url is not None:
            pages += 1
            if pages > _MAX_PAGES:
                raise HubError(f"hf:{repo}: the listing at {self.endpoint} never ended")
            resp = await self._follow(url, {"Accept": "application/json"})
            try:
                if resp.status != 200:
                    raise await self._status_error(resp, repo=repo, revision=revision)
                try:
                    entries = await resp.json(content_type=None)
                except (ValueError, aiohttp.ClientError) as exc:
                    raise HubError(
                        f"hf:{repo}: {self.endpoint} sent a listing that is not JSON: {exc}"
                    ) from None
                next_link = resp.links.get("next")
            finally:
                resp.release()
            files.extend(_entries(entries, repo))
            url = None
            if next_link is not None:
                candidate = URL(str(next_link.get("url", "")))
                candidate = resp.url.join(candidate) if not candidate.is_absolute() else candidate
                # A page link elsewhere would be sent the token.
                if not self._same_origin(candidate):
                    raise HubError(f"hf:{repo}: listing page link leaves {self.endpoint}")
                url = candidate
        return files

    @asynccontextmanager
    async def download(
        self,
        url: str,
        *,
        offset: int = 0,
        repo: str | None = None,
        path: str | None = None,
    ) -> AsyncIterator[Body]:
        """Open ``url`` from ``offset``; 200, 206 and 416 are given to the caller, every
        other answer raises naming the file (``repo``/``path`` when it is a hub file)."""
        target = URL(url)
        headers: dict[str, str] = {}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        resp = await self._follow(target, headers)
        try:
            if resp.status not in (200, 206, 416):
                raise await self._status_error(resp, repo=repo, path=path, url=url)
            length = resp.content_length if resp.status in (200, 206) else None
            start: int | None = 0
            total: int | None = None
            if resp.status == 200:
                total = length
            else:
                start, total = _content_range(resp.headers.get("Content-Range"))
                if resp.status == 206 and start is None:
                    raise HubError(
                        f"{target.host} answered 206 without a usable Content-Range "
                        f"({resp.headers.get('Content-Range')!r})"
                    )
            yield Body(
                status=resp.status,
                offset=start or 0,
                length=length,
                total=total,
                _response=resp,
                _host=str(resp.url.host),
            )
        finally:
            # Closing (not releasing) a body left unread keeps a half-read connection
            # out of the pool.
            resp.close()

    async def _status_error(
        self,
        resp: aiohttp.ClientResponse,
        *,
        repo: str | None = None,
        revision: str = "main",
        path: str | None = None,
        url: str | None = None,
    ) -> HubError:
        code = resp.headers.get("X-Error-Code", "")
        detail = resp.headers.get("X-Error-Message", "")
        if not detail:
            try:
                detail = (await resp.content.read(300)).decode("utf-8", "replace").strip()
            except (aiohttp.ClientError, TimeoutError):
                detail = ""
        detail = detail.splitlines()[0][:200] if detail else ""
        said = f" ({detail})" if detail else ""
        status = resp.status
        what = f"hf:{repo}" + (f" file {path}" if path else "") if repo else (url or "")
        hub = repo is not None
        if status in (401, 403) and hub:
            if code == "GatedRepo" or status == 403:
                fix = (
                    "the repository is gated: accept its terms on the hub with the account "
                    "whose token is in HF_TOKEN"
                    if self.has_token
                    else "the repository is gated or private: set HF_TOKEN to a token "
                    "that may read it"
                )
            elif self.has_token:
                fix = "HF_TOKEN was refused, or the repository is private or does not exist"
            else:
                fix = (
                    "the repository is gated or private (or does not exist): set HF_TOKEN "
                    "to a token that may read it"
                )
            return HubAuthError(f"{what}: {self.endpoint} answered {status}{said}: {fix}")
        if status in (401, 403):
            return HubAuthError(f"{what}: the server answered {status}{said}")
        if status == 404:
            if hub and code == "RevisionNotFound":
                return HubNotFound(f"hf:{repo}: revision {revision!r} not found{said}")
            if hub and path and code != "RepoNotFound":
                return HubNotFound(f"{what}: not found in the repository{said}")
            if hub:
                return HubNotFound(f"hf:{repo}: repository not found at {self.endpoint}{said}")
            return HubNotFound(f"{what}: not found (404){said}")
        if status == 429 or status >= 500:
            return NetworkError(f"{what}: the server answered {status}{said}; try again later")
        return HubError(f"{what}: the server answered {status}{said}")


def _entries(data: Any, repo: str) -> list[HubFile]:
    if not isinstance(data, list):
        raise HubError(f"hf:{repo}: the listing is not a list of files")
    files: list[HubFile] = []
    for entry in data:
        if not isinstance(entry, dict) or entry.get("type", "file") != "file":
            continue
        path = entry.get("path")
        if not isinstance(path, str):
            continue
        size = entry.get("size")
        sha: str | None = None
        lfs = entry.get("lfs")
        if isinstance(lfs, dict):
            oid = lfs.get("oid") or lfs.get("sha256")
            if isinstance(oid, str):
                sha = oid.removeprefix("sha256:").lower()
            if isinstance(lfs.get("size"), int):
                size = lfs["size"]
        # Only a sha256 is a checksum we can use: non-LFS oids are git's sha1 of a blob.
        if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
            sha = None
        files.append(
            HubFile(
                path=path, size=size if isinstance(size, int) and size >= 0 else None, sha256=sha
            )
        )
    return files


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(start, total) of ``bytes START-END/TOTAL`` or ``bytes */TOTAL``; None for unknown."""
    if not value or not value.startswith("bytes "):
        return None, None
    span, _, total_text = value[6:].partition("/")
    total = int(total_text) if total_text.isdigit() else None
    start_text = span.partition("-")[0]
    start = int(start_text) if start_text.isdigit() else None
    return start, total


def _origin(url: URL) -> tuple[str, str, int | None]:
    return (url.scheme, (url.host or "").lower(), url.port)
