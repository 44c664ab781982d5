"""The hub's model listing: its trending or searched repositories, and one repository's
facts, as the model explorer reads them.

Two calls of the Hugging Face API, through the same client (endpoint, token, redirects
kept on the hub's origin) as the weights' fetches (``hub.py``):

- ``GET {endpoint}/api/models?search=Q&sort=trendingScore&limit=100&expand=...``: a
  page of repositories, each with the fields named in ``expand`` only: ``gguf`` (the
  hub's reading of a GGUF header: ``total`` parameters, ``architecture``,
  ``context_length``), ``safetensors`` (``parameters``: a count per dtype, ``total``),
  ``config`` (``model_type``, ``quantization_config``), ``siblings``
  (``rfilename`` each), ``pipeline_tag``, ``tags``, ``library_name``, ``downloads``,
  ``likes``, ``trendingScore``, ``gated``. ``filter=gguf`` asks for GGUF repositories
  only.
- ``GET {endpoint}/api/models/{repo}?expand=...``: one repository with the same fields;
  its files with their sizes come from the tree listing (``HubClient.list_files``).

Whatever the hub answers is read field by field: a field of the wrong type is absent
(None), an answer that is not a list of objects (or one object) is a ``HubError`` saying
so. No figure is guessed here; sizing is the explorer's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from yarl import URL

from llmgw.modelkit.hub import HubClient, HubError, HubFile
from llmgw.modelkit.sources import SourceError, parse_source

# The fields the explorer judges by, asked of the listing and of one repository.
EXPAND = (
    "gguf",
    "safetensors",
    "config",
    "siblings",
    "pipeline_tag",
    "tags",
    "library_name",
    "downloads",
    "likes",
    "trendingScore",
    "gated",
)
SORTS = ("trendingScore", "likes", "downloads")
# The hub answers at most this many repositories a page.
MAX_LIMIT = 100
# A listing of a hundred repositories with their siblings is a few MiB at most.
MAX_ANSWER_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class GgufSummary:
    """The hub's reading of a repository's GGUF header."""

    total: int | None
    architecture: str | None
    context_length: int | None


@dataclass(frozen=True)
class SafetensorsSummary:
    """Parameters per dtype (``BF16``, ``F8_E4M3``, ``I32``...) as the hub counts them."""

    parameters: Mapping[str, int]
    total: int | None


@dataclass(frozen=True)
class HubRepo:
    """One repository as the hub lists it; a field it did not send is None."""

    id: str
    pipeline_tag: str | None = None
    library_name: str | None = None
    tags: tuple[str, ...] = ()
    downloads: int | None = None
    likes: int | None = None
    trending_score: int | None = None
    gated: bool = False
    gguf: GgufSummary | None = None
    safetensors: SafetensorsSummary | None = None
    model_type: str | None = None
    # ``config.quantization_config.quant_method``: awq, gptq, fp8, mxfp4, bitsandbytes...
    quant_method: str | None = None
    quant_bits: int | None = None
    siblings: tuple[str, ...] = ()


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value >= 0 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _gguf(value: object) -> GgufSummary | None:
    if not isinstance(value, dict):
        return None
    return GgufSummary(
        total=_int(value.get("total")) or None,
        architecture=_text(value.get("architecture")),
        context_length=_int(value.get("context_length")) or None,
    )


def _safetensors(value: object) -> SafetensorsSummary | None:
    if not isinstance(value, dict):
        return None
    params = value.get("parameters")
    counts: dict[str, int] = {}
    if isinstance(params, dict):
        for dtype, count in params.items():
            n = _int(count)
            if isinstance(dtype, str) and n is not None:
                counts[dtype.upper()] = n
    if not counts:
        return None
    return SafetensorsSummary(parameters=counts, total=_int(value.get("total")))


def repo_from_json(value: object) -> HubRepo | None:
    """A repository from the hub's JSON; None when it has no id (not one at all)."""
    if not isinstance(value, dict):
        return None
    repo_id = _text(value.get("id")) or _text(value.get("modelId"))
    if repo_id is None or not is_repo_id(repo_id):
        return None
    tags = value.get("tags")
    siblings = value.get("siblings")
    config = value.get("config")
    quant: object = config.get("quantization_config") if isinstance(config, dict) else None
    method = _text(quant.get("quant_method")) if isinstance(quant, dict) else None
    bits = _int(quant.get("bits")) if isinstance(quant, dict) else None
    return HubRepo(
        id=repo_id,
        pipeline_tag=_text(value.get("pipeline_tag")),
        library_name=_text(value.get("library_name")),
        tags=tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else (),
        downloads=_int(value.get("downloads")),
        likes=_int(value.get("likes")),
        trending_score=_int(value.get("trendingScore")),
        # "auto" or "manual" when gated, false when not.
        gated=isinstance(value.get("gated"), str),
        gguf=_gguf(value.get("gguf")),
        safetensors=_safetensors(value.get("safetensors")),
        model_type=_text(config.get("model_type")) if isinstance(config, dict) else None,
        quant_method=method.lower() if method else None,
        quant_bits=bits,
        siblings=tuple(
            s["rfilename"]
            for s in siblings
            if isinstance(s, dict) and isinstance(s.get("rfilename"), str)
        )
        if isinstance(siblings, list)
        else (),
    )


def is_repo_id(text: str) -> bool:
    """Whether ``text`` is a repository's ORG/REPO as a source names it: what the pages
    link to and ``ctl model serve`` takes, never a path that climbs or a selector."""
    try:
        found = parse_source(f"hf:{text}")
    except SourceError:
        return False
    return found.repo == text and found.quant is None and found.file is None


class HubListing(HubClient):
    """The hub's listing API over ``HubClient``'s connection rules."""

    async def _json(self, url: URL, what: str, repo: str | None = None) -> object:
        resp = await self._follow(url, {"Accept": "application/json"})
        try:
            if resp.status == 404 and repo is None:
                raise HubError(
                    f"{self.endpoint} has no model listing (GET /api/models answered 404); "
                    "is hf_endpoint a Hugging Face hub? (an offline mirror serves files only)"
                )
            if resp.status != 200:
                raise await self._status_error(resp, repo=repo, url=str(url))
            if resp.content_length is not None and resp.content_length > MAX_ANSWER_BYTES:
                raise HubError(f"{self.endpoint} sent {what} of {resp.content_length} bytes")
            try:
                body = await resp.content.read(MAX_ANSWER_BYTES + 1)
            except aiohttp.ClientError as exc:
                raise HubError(f"{self.endpoint}: {what} was cut: {exc}") from None
        finally:
            resp.release()
        if len(body) > MAX_ANSWER_BYTES:
            raise HubError(f"{self.endpoint} sent {what} past {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError as exc:
            start = body[:60].decode("utf-8", "replace")
            raise HubError(
                f"{self.endpoint} answered {what} with something that is not JSON "
                f"({exc}; it began {start!r}); is hf_endpoint a Hugging Face hub?"
            ) from None

    async def list_models(
        self,
        search: str | None = None,
        *,
        sort: str = "trendingScore",
        limit: int = MAX_LIMIT,
        gguf_only: bool = False,
    ) -> list[HubRepo]:
        """One page of repositories, best first by ``sort``."""
        if sort not in SORTS:
            raise HubError(f"sort {sort!r}: the explorer sorts by {', '.join(SORTS)}")
        query: list[tuple[str, str]] = [("sort", sort), ("limit", str(min(limit, MAX_LIMIT)))]
        if search:
            query.append(("search", search))
        if gguf_only:
            query.append(("filter", "gguf"))
        query += [("expand", field) for field in EXPAND]
        url = URL(f"{self.endpoint}/api/models").with_query(query)
        data = await self._json(url, "the model listing")
        if not isinstance(data, list):
            raise HubError(
                f"{self.endpoint} answered the model listing with {type(data).__name__}, "
                "not a list of repositories; is hf_endpoint a Hugging Face hub?"
            )
        repos = [r for r in (repo_from_json(item) for item in data) if r is not None]
        if data and not repos:
            raise HubError(
                f"{self.endpoint} answered the model listing with {len(data)} entries and "
                "none of them a repository (no 'id'); is hf_endpoint a Hugging Face hub?"
            )
        return repos

    async def model_info(self, repo: str) -> HubRepo:
        """One repository's facts (the listing's fields)."""
        url = URL(f"{self.endpoint}/api/models/{repo}", encoded=True).with_query(
            [("expand", field) for field in EXPAND]
        )
        found = repo_from_json(await self._json(url, f"hf:{repo}", repo=repo))
        if found is None:
            raise HubError(
                f"{self.endpoint} answered hf:{repo} with something that is not a repository"
            )
        return found

    async def repository(self, repo: str) -> tuple[HubRepo, Sequence[HubFile]]:
        """A repository's facts and its files with their sizes (the tree listing)."""
        info = await self.model_info(repo)
        return info, await self.list_files(repo)
