"""The weights tests' helpers: a small Hugging Face compatible hub on loopback, run
in the test's own event loop.

It answers what the agent asks of the real hub: the recursive tree listing (sizes, LFS
sha256, ``Link`` pages), ``resolve`` with Range (206 + Content-Range, 416 past the end),
401 for a gated repository without the token, 404s with the hub's ``X-Error-Code``,
redirects to a "CDN" on another origin, and plain files for URL sources. Knobs make a
file cut the connection part way, ignore Range, go without Content-Length, or wait.
Every request is recorded so tests can count downloads and read the headers sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass, field

from aiohttp import web

from llmgw.wire.messages import DownloadProgress

TOKEN = "hf_test_token"


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


@dataclass
class Served:
    content: bytes
    lfs: bool = True
    published_sha: str | None = None  # what the listing says, when not the real one
    cut_after: int | None = None  # cut the connection after this many body bytes...
    cuts: int = 0  # ...for this many requests
    ignore_range: bool = False
    no_length: bool = False
    hold: asyncio.Event | None = None  # after half the body, wait for this

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    sent: int = 0  # body bytes served


@dataclass
class FakeHub:
    endpoint: str = ""
    repos: dict[str, dict[str, Served]] = field(default_factory=dict)
    urls: dict[str, Served] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    page_size: int | None = None
    cdn: str | None = None  # resolve redirects to this origin when set
    requests: list[Seen] = field(default_factory=list)
    got_request: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, repo: str, path: str, content: bytes, **kw: object) -> Served:
        served = Served(content, **kw)  # type: ignore[arg-type]
        self.repos.setdefault(repo, {})[path] = served
        return served

    def downloads(self, contains: str = "") -> list[Seen]:
        """Requests for file bodies (resolve, CDN, plain files) whose path holds ``contains``."""
        return [
            r
            for r in self.requests
            if ("/resolve/" in r.path or r.path.startswith(("/cdn/", "/files/")))
            and contains in r.path
        ]

    def listings(self) -> list[Seen]:
        return [r for r in self.requests if r.path.startswith("/api/models/")]

    def _authorised(self, request: web.Request, repo: str) -> bool:
        return repo not in self.gated or request.headers.get("Authorization") == (f"Bearer {TOKEN}")

    def _record(self, request: web.Request) -> None:
        self.requests.append(Seen(request.method, request.path, dict(request.headers)))
        self.got_request.set()

    async def tree(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo not in self.repos:
            return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
        if not self._authorised(request, repo):
            return web.Response(
                status=401,
                headers={"X-Error-Code": "GatedRepo", "X-Error-Message": "Access restricted"},
            )
        entries: list[dict[str, object]] = [{"type": "directory", "path": "sub", "oid": "x"}]
        for path, served in sorted(self.repos[repo].items()):
            entry: dict[str, object] = {
                "type": "file",
                "path": path,
                "size": len(served.content),
                "oid": hashlib.sha1(served.content).hexdigest(),
            }
            if served.lfs:
                sha = served.published_sha or served.sha256
                entry["lfs"] = {"oid": sha, "size": len(served.content), "pointerSize": 134}
            entries.append(entry)
        headers = {}
        if self.page_size:
            start = int(request.query.get("cursor", "0"))
            end = start + self.page_size
            if end < len(entries):
                url = request.url.update_query(cursor=str(end))
                headers["Link"] = f'<{url}>; rel="next"'
            entries = entries[start:end]
        return web.json_response(entries, headers=headers)

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        path = request.match_info["path"]
        if repo not in self.repos:
            return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
        if not self._authorised(request, repo):
            return web.Response(status=401, headers={"X-Error-Code": "GatedRepo"})
        if path not in self.repos[repo]:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        if self.cdn:
            raise web.HTTPFound(f"{self.cdn}/cdn/{repo}/{path}")
        return await serve(request, self.repos[repo][path], self.requests[-1])

    async def cdn_file(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        return await serve(request, self.repos[repo][request.match_info["path"]], self.requests[-1])

    async def plain_file(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        served = self.urls.get(request.match_info["name"])
        if served is None:
            return web.Response(status=404)
        return await serve(request, served, self.requests[-1])


async def serve(
    request: web.Request, served: Served, seen: Seen | None = None
) -> web.StreamResponse:
    content = served.content
    start = 0
    status = 200
    headers: dict[str, str] = {}
    ranged = request.headers.get("Range", "")
    stop = len(content)
    if ranged.startswith("bytes=") and not served.ignore_range:
        first, _, last = ranged[6:].partition("-")
        start = int(first)
        if start >= len(content):
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(content)}"})
        if last:
            stop = min(stop, int(last) + 1)
        status = 206
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(content)}"
    body = content[start:stop]
    resp = web.StreamResponse(status=status, headers=headers)
    if served.no_length:
        resp.enable_chunked_encoding()
    else:
        resp.content_length = len(body)
    await resp.prepare(request)
    limit = len(body)
    cutting = served.cut_after is not None and served.cuts > 0
    if cutting:
        assert served.cut_after is not None
        served.cuts -= 1
        limit = served.cut_after - start
    sent = 0
    step = 8192
    while sent < limit:
        piece = body[sent : min(sent + step, limit)]
        await resp.write(piece)
        sent += len(piece)
        if seen is not None:
            seen.sent = sent
        if served.hold is not None and sent >= limit // 2:
            await served.hold.wait()
    if cutting:
        # Let the client read what was sent first: aiohttp drops a response's unread
        # buffer when the connection breaks, and the test wants a known resume point.
        await asyncio.sleep(0.3)
        assert request.transport is not None
        request.transport.close()
        return resp
    await resp.write_eof()
    return resp


class Progress:
    """Collects reports; one instance is one callback."""

    def __init__(self) -> None:
        self.reports: list[DownloadProgress] = []

    def __call__(self, report: DownloadProgress) -> None:
        self.reports.append(report)

    @property
    def last(self) -> DownloadProgress:
        return self.reports[-1]


async def start_hub() -> tuple[FakeHub, web.AppRunner]:
    fake = FakeHub()
    app = web.Application()
    app.router.add_get("/api/models/{org}/{name}/tree/{rev}", fake.tree)
    app.router.add_get("/{org}/{name}/resolve/{rev}/{path:.+}", fake.resolve)
    app.router.add_get("/cdn/{org}/{name}/{path:.+}", fake.cdn_file)
    app.router.add_get("/files/{name}", fake.plain_file)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.endpoint = f"http://127.0.0.1:{port}"
    return fake, runner
