"""The Hugging Face hub: its client over aiohttp (and plain HTTPS downloads), and which
files of a repository a source means.

Shared by both roles: the agent fetches weights with it, the control plane's planner
reads a model's listing and the first bytes of its GGUF header with it.

Two calls: a repository's file listing with sizes and sha256
(``GET {endpoint}/api/models/{repo}/tree/{rev}?recursive=true``, following the
``Link: rel="next"`` pages), and a download of one file
(``GET {endpoint}/{repo}/resolve/{rev}/{path}``, or any https:// URL) from a byte
offset with ``Range`` (optionally up to an end, for reading a header).

The endpoint is configuration, else ``HF_ENDPOINT``, else https://huggingface.co; the
token is configuration, else ``HF_TOKEN``. The token goes only to the endpoint's own
origin: redirects are followed here rather than by aiohttp so a hop to a CDN or to any
other host never carries it.

Which files a source selects:

- A quantisation picks the GGUF whose path carries it as a whole word (``Q4_K`` is not
  ``Q4_K_M``, ``Q4_XS`` is not ``IQ4_XS``), case-insensitive, leaving out multimodal
  projectors (``mmproj-*``); a split GGUF comes with all its parts. More than one match
  is ambiguous and names the candidates.
- A file comes alone, or with its sibling parts when it is one part of a split GGUF.
- Either comes with the repository's multimodal projector, when it holds one (chosen
  as ``llmgw.modelkit.projector`` says): a vision model's other half.
- A whole repository means its safetensors with the JSON and tokenizer files beside
  them; never the ``training_args.bin`` or ``optimizer.pt`` pickles such repositories
  often also hold. Only where a repository has no safetensors at all are its pickled
  weights chosen, for the pickle rule to refuse unless the model allows them.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote

import aiohttp
from yarl import URL

from llmgw.modelkit.projector import choose_projector, is_projector
from llmgw.modelkit.sources import (
    Source,
    SourceError,
    WeightsError,
    is_loopback_host,
    is_pickled,
    repo_path_problem,
)

DEFAULT_ENDPOINT = "https://huggingface.co"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10
_MAX_PAGES = 1000


class HubError(WeightsError):
    """The hub (or a plain HTTP server) answered something other than the file."""


class HubAuthError(HubError):
    """401/403: a gated or private repository, or a token that was refused."""


class HubNotFound(HubError):
    """404: no such repository, revision or file."""


class NetworkError(HubError):
    """The connection failed or was cut; what was written so far is kept for resuming."""


_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# Files a transformers-layout model needs beside its weights; all plain data.
_AUX_NAMES = frozenset({"tokenizer.model", "merges.txt", "vocab.txt", "spiece.model"})
_AUX_SUFFIXES = (".json", ".tiktoken", ".jinja")


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
        end: int | None = None,
        repo: str | None = None,
        path: str | None = None,
    ) -> AsyncIterator[Body]:
        """Open ``url`` from ``offset`` (up to ``end``, exclusive, when given); 200, 206
        and 416 are given to the caller, every other answer raises naming the file
        (``repo``/``path`` when it is a hub file)."""
        target = URL(url)
        headers: dict[str, str] = {}
        if end is not None:
            headers["Range"] = f"bytes={offset}-{end - 1}"
        elif offset:
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

    async def read_range(
        self,
        url: str,
        offset: int,
        end: int,
        *,
        repo: str | None = None,
        path: str | None = None,
    ) -> tuple[bytes, int | None]:
        """Bytes ``offset`` to ``end`` (exclusive) of a file, fewer at its end, and the
        file's size when the server said. A server that ignores Range is read only as
        far as asked, then the connection is dropped: never the whole file."""
        async with self.download(url, offset=offset, end=end, repo=repo, path=path) as body:
            if body.status == 416:
                return b"", body.total
            skip = offset - body.offset
            wanted = end - body.offset
            chunks: list[bytes] = []
            got = 0
            while got < wanted:
                chunk = await body.read(min(1 << 20, wanted - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            data = b"".join(chunks)[max(0, skip) : wanted]
            return data, body.total

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


def _entries(data: object, repo: str) -> list[HubFile]:
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


# ------------------------------------------------------------------------ selection


@dataclass(frozen=True)
class Selection:
    """The files to fetch, and the one the engine is given (``""``: the directory);
    ``projector``: the multimodal projector among ``files`` (llama.cpp's ``--mmproj``)."""

    files: list[HubFile]
    entry: str
    projector: str | None = None


def _listed(files: list[HubFile], limit: int = 12) -> str:
    names = [f.path for f in files[:limit]]
    more = f" and {len(files) - limit} more" if len(files) > limit else ""
    return ", ".join(names) + more if names else "none"


def _check_paths(source: Source, files: list[HubFile]) -> None:
    for f in files:
        problem = repo_path_problem(f.path)
        if problem:
            raise HubError(f"{source.text}: the hub listed an unsafe path {f.path!r}: {problem}")


def _hidden(path: str) -> bool:
    return any(
        segment.startswith(".") and segment not in (".", "..") for segment in path.split("/")
    )


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def split_key(path: str) -> tuple[str, int, int] | None:
    """(stem, part, count) of a ``-0000N-of-0000M.gguf`` path, else None."""
    m = _SPLIT.match(path)
    if not m:
        return None
    return m.group("stem"), int(m.group("part")), int(m.group("count"))


def _quant_pattern(quant: str) -> re.Pattern[str]:
    # Word boundaries by hand: '_' continues a quantisation name (Q4_K -> Q4_K_M) but may
    # also precede one (model_Q4_K_M.gguf).
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)


def _group(source: Source, chosen: HubFile, listing: list[HubFile]) -> list[HubFile]:
    """A file with every part of its split set, checked complete, first part first."""
    key = split_key(chosen.path)
    if key is None:
        return [chosen]
    stem, _, count = key
    parts: dict[int, HubFile] = {}
    for f in listing:
        k = split_key(f.path)
        if k is not None and k[0] == stem and k[2] == count:
            parts[k[1]] = f
    missing = [n for n in range(1, count + 1) if n not in parts]
    if missing:
        raise HubNotFound(
            f"{source.text}: split GGUF {stem} has {count} parts but the repository lacks "
            f"part(s) {', '.join(str(n) for n in missing)}"
        )
    return [parts[n] for n in range(1, count + 1)]


def _groups(files: list[HubFile]) -> dict[str, list[HubFile]]:
    groups: dict[str, list[HubFile]] = {}
    for f in files:
        key = split_key(f.path)
        groups.setdefault(f"{key[0]}@{key[2]}" if key else f.path, []).append(f)
    return groups


def select_files(source: Source, listing: list[HubFile]) -> Selection:
    """The files of ``listing`` that ``source`` (an hf: source) means."""
    # Hidden files (.gitattributes, .cache/) are never weights, and could shadow our
    # own markers; a path that climbs out means a hub not to be trusted at all.
    listing = [f for f in listing if not _hidden(f.path)]
    _check_paths(source, listing)
    ggufs = sorted((f for f in listing if is_gguf(f.path)), key=lambda f: f.path)
    if source.file is not None:
        chosen = next((f for f in listing if f.path == source.file), None)
        if chosen is None:
            raise HubNotFound(
                f"{source.text}: no file {source.file!r} in the repository "
                f"(GGUF files there: {_listed(ggufs)})"
            )
        files = _group(source, chosen, listing)
        return _with_projector(files, listing)
    if source.quant is not None:
        pattern = _quant_pattern(source.quant)
        matches = [f for f in ggufs if pattern.search(f.path) and not is_projector(f.path)]
        if not matches:
            raise HubNotFound(
                f"{source.text}: no GGUF file carries {source.quant} "
                f"(GGUF files there: {_listed(ggufs)}); name another quantisation, or a "
                "file as hf:ORG/REPO:PATH.gguf"
            )
        groups = _groups(matches)
        if len(groups) > 1:
            firsts = sorted(min(g, key=lambda f: f.path).path for g in groups.values())
            raise SourceError(
                f"{source.text}: {source.quant} matches {len(groups)} files "
                f"({', '.join(firsts)}); name one as hf:ORG/REPO:PATH.gguf"
            )
        (group,) = groups.values()
        files = _group(source, min(group, key=lambda f: f.path), listing)
        return _with_projector(files, listing)
    return _whole_repository(source, listing, ggufs)


def _with_projector(files: list[HubFile], listing: list[HubFile]) -> Selection:
    """A GGUF file (and its parts) with the repository's projector, when it has one and
    the file is not a projector itself."""
    entry = files[0].path
    chosen = None if is_projector(entry) else choose_projector([f.path for f in listing], entry)
    projector = next((f for f in listing if f.path == chosen), None)
    if projector is None:
        return Selection(files=files, entry=entry)
    return Selection(files=[*files, projector], entry=entry, projector=projector.path)


def _is_aux(path: str) -> bool:
    name = PurePosixPath(path).name
    return name in _AUX_NAMES or name.lower().endswith(_AUX_SUFFIXES)


def _whole_repository(source: Source, listing: list[HubFile], ggufs: list[HubFile]) -> Selection:
    weights = [f for f in listing if f.path.lower().endswith(".safetensors")]
    if not weights:
        # Left for the pickle rule to refuse by name, or to fetch when allowed.
        weights = [f for f in listing if is_pickled(f.path)]
    if not weights:
        if ggufs:
            raise SourceError(
                f"{source.text} holds GGUF files, not safetensors: name one as "
                f"{source.text}:QUANT (e.g. :Q4_K_M) or {source.text}:PATH.gguf "
                f"(GGUF files there: {_listed(ggufs)})"
            )
        raise HubNotFound(
            f"{source.text}: no weights in the repository (no .safetensors or .gguf files; "
            f"files there: {_listed(listing)})"
        )
    aux = [f for f in listing if _is_aux(f.path)]
    files = sorted({f.path: f for f in [*weights, *aux]}.values(), key=lambda f: f.path)
    return Selection(files=files, entry="")
