"""Weights sources as written in the catalog, their normal form, cache name, and the
pickle rule.

Accepted forms:

- ``hf:ORG/REPO``: the repository's safetensors with its config and tokenizer files.
- ``hf:ORG/REPO:QUANT`` (``Q4_K_M``, ``IQ4_XS``, ``BF16``...): the GGUF file, or the set
  of split GGUF files, whose path carries that quantisation (case-insensitive).
- ``hf:ORG/REPO:PATH/IN/REPO.gguf``: one file (all of its set, for a split GGUF).
- ``https://HOST/PATH/FILE``: one file. ``http://`` only to a loopback host, or where
  the operator allowed plain HTTP on purpose: on any other network a plain download can
  be replaced in flight, and a model file is code the engine runs.
- ``/ABSOLUTE/PATH``: a file or directory already on the node, used where it is, never
  copied and never deleted.

Nothing here does IO; the control plane checks the catalog's sources with it and the
agent fetches by it, so it lives outside both roles.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import unquote

from yarl import URL


class WeightsError(Exception):
    """Base of every refusal or failure about a model's weights."""


class SourceError(WeightsError, ValueError):
    """A source string that is not one of the accepted forms, or names nothing usable."""


class PickleRefused(WeightsError):
    """The source is, or would fetch, Python pickles, and the model did not allow them."""


ACCEPTED_FORMS = (
    "accepted forms: hf:ORG/REPO, hf:ORG/REPO:QUANT (e.g. hf:ORG/REPO:Q4_K_M), "
    "hf:ORG/REPO:PATH/IN/REPO.gguf, https://HOST/PATH/FILE, /ABSOLUTE/LOCAL/PATH"
)

# Python pickles run whatever they hold when loaded. .pt2 (torch.export) and .joblib
# carry pickles too.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".pt2", ".joblib"})

# Hugging Face's own rule for an owner or a repository name.
_HF_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?\Z")
# Quantisation names never hold a dot; that is what tells one from a file path.
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}\Z")
# The name of every directory this package creates in the cache: a readable prefix
# and the first 16 hex digits of sha256(normalised source). Collecting deletes nothing
# else.
CACHE_NAME = re.compile(r"^(?:hf|url)--[a-z0-9._-]{1,160}--[0-9a-f]{16}\Z")
_HASH_LEN = 16
_PART_MAX = 48


@dataclass(frozen=True)
class Source:
    """A parsed source. ``text`` is its normal form, the one its cache name hashes."""

    kind: Literal["hf", "url", "local"]
    text: str
    repo: str | None = None  # "ORG/REPO" as written (the hub resolves it either case)
    quant: str | None = None  # upper case
    file: str | None = None  # a path inside the repository
    url: str | None = None
    filename: str | None = None  # a URL's local file name
    path: Path | None = None  # a local source

    def __str__(self) -> str:
        return self.text


def parse_source(text: str, *, allow_http: bool = False) -> Source:
    """Parse one source string, refusing anything but the accepted forms by name."""
    if not isinstance(text, str) or not text.strip():
        raise SourceError(f"empty weights source; {ACCEPTED_FORMS}")
    raw = text.strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise SourceError(f"weights source {raw!r} holds control characters; {ACCEPTED_FORMS}")
    if raw.startswith("hf:"):
        return _parse_hf(raw)
    lowered = raw.lower()
    if lowered.startswith(("https://", "http://")):
        return _parse_url(raw, allow_http=allow_http)
    if raw.startswith("/"):
        return _parse_local(raw)
    if "://" in raw:
        scheme = raw.split("://", 1)[0]
        raise SourceError(
            f"weights source {raw!r}: scheme {scheme!r} is not fetched; {ACCEPTED_FORMS}"
        )
    raise SourceError(
        f"weights source {raw!r} is not recognised (a local path must be absolute); "
        f"{ACCEPTED_FORMS}"
    )


def _parse_hf(raw: str) -> Source:
    body = raw[3:]
    if body.startswith("//"):
        raise SourceError(
            f"weights source {raw!r}: write hf:ORG/REPO, without //; {ACCEPTED_FORMS}"
        )
    repo_part, sep, selector = body.partition(":")
    owner, slash, name = repo_part.partition("/")
    if not slash or "/" in name:
        raise SourceError(
            f"weights source {raw!r}: the repository must be ORG/REPO, got {repo_part!r}; "
            f"{ACCEPTED_FORMS}"
        )
    for part, what in ((owner, "organisation"), (name, "repository name")):
        if not _HF_NAME.match(part) or "--" in part or ".." in part:
            raise SourceError(
                f"weights source {raw!r}: {what} {part!r} is not a Hugging Face name "
                "(letters, digits, '-', '_', '.'; no '--' or '..'; at most 96 characters)"
            )
    repo = f"{owner}/{name}"
    base = f"hf:{repo.lower()}"
    if not sep:
        return Source(kind="hf", text=base, repo=repo)
    if not selector:
        raise SourceError(
            f"weights source {raw!r}: nothing after ':'; name a quantisation or a file; "
            f"{ACCEPTED_FORMS}"
        )
    if "." not in selector and "/" not in selector:
        if not _QUANT.match(selector):
            raise SourceError(
                f"weights source {raw!r}: {selector!r} is neither a quantisation "
                f"(like Q4_K_M) nor a file path with an extension; {ACCEPTED_FORMS}"
            )
        quant = selector.upper()
        return Source(kind="hf", text=f"{base}:{quant}", repo=repo, quant=quant)
    problem = repo_path_problem(selector)
    if problem:
        raise SourceError(f"weights source {raw!r}: file {selector!r} {problem}")
    return Source(kind="hf", text=f"{base}:{selector}", repo=repo, file=selector)


def repo_path_problem(path: str) -> str | None:
    """Why a path inside a repository cannot be stored under the cache, or None.

    Applied to what the catalog names and to every path a hub lists, since either
    could otherwise place a file outside the source's directory.
    """
    if not path or len(path) > 1000:
        return "must be a relative path of at most 1000 characters"
    if path.startswith("/") or "\\" in path or "\x00" in path:
        return "must be a relative path with '/' separators"
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            return "must not hold empty, '.' or '..' segments"
        if segment.startswith("."):
            # Our own markers are hidden files; no fetched file may take their place.
            return "must not hold hidden ('.'-first) segments"
    if path.endswith(".part"):
        return "must not end in .part (the name of a file still being fetched)"
    return None


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _parse_url(raw: str, *, allow_http: bool) -> Source:
    try:
        url = URL(raw)
    except (ValueError, TypeError) as exc:
        raise SourceError(f"weights source {raw!r} is not a valid URL: {exc}") from None
    if not url.host:
        raise SourceError(f"weights source {raw!r}: the URL has no host; {ACCEPTED_FORMS}")
    if url.user is not None or url.password is not None:
        raise SourceError(
            f"weights source {raw!r}: a user or password in the URL is refused (it would be "
            "kept in the catalog, logs and cache names); serve the file without one"
        )
    if url.scheme == "http" and not allow_http and not is_loopback_host(url.host):
        raise SourceError(
            f"weights source {raw!r}: plain http:// is refused except to a loopback host, "
            "since a download on an open network can be replaced in flight; use https://, "
            "or allow plain HTTP in the agent's weights settings on purpose"
        )
    segment = unquote(url.raw_path.rsplit("/", 1)[-1])
    if not segment or segment in (".", "..") or "/" in segment or "\\" in segment:
        raise SourceError(f"weights source {raw!r}: the URL must end in a file name")
    problem = repo_path_problem(segment)
    if problem:
        raise SourceError(f"weights source {raw!r}: file name {segment!r} {problem}")
    # The fragment never reaches the server, so it is not part of what is fetched.
    text = str(url.with_fragment(None))
    return Source(kind="url", text=text, url=text, filename=segment)


def _parse_local(raw: str) -> Source:
    pure = PurePosixPath(raw)
    if ".." in pure.parts:
        raise SourceError(f"weights source {raw!r}: a local path must not hold '..'")
    return Source(kind="local", text=str(pure), path=Path(pure))


def normalise_source(text: str, *, allow_http: bool = True) -> str:
    """The normal form of a source string: equal forms share one cache directory.

    Plain HTTP is accepted here by default since naming a source is not fetching it.
    """
    return parse_source(text, allow_http=allow_http).text


def _readable(value: str) -> str:
    cleaned = re.sub(r"[^a-z0-9._]+", "-", value.lower()).strip("-.")
    return cleaned[:_PART_MAX].strip("-.") or "x"


def cache_name(source: str | Source) -> str:
    """The directory a source is stored under: a readable prefix, then a hash.

    The hash alone identifies the source; the prefix is for the operator listing the
    cache. A local path has none, since it is never stored in the cache.
    """
    src = source if isinstance(source, Source) else parse_source(source, allow_http=True)
    digest = hashlib.sha256(src.text.encode()).hexdigest()[:_HASH_LEN]
    if src.kind == "hf":
        assert src.repo is not None
        owner, name = src.repo.split("/")
        parts = ["hf", _readable(owner), _readable(name)]
        if src.quant:
            parts.append(_readable(src.quant))
        elif src.file:
            parts.append(_readable(PurePosixPath(src.file).name))
    elif src.kind == "url":
        url = URL(src.text)
        parts = ["url", _readable(url.host or "host"), _readable(src.filename or "file")]
    else:
        raise SourceError(
            f"{src.text} is a local path: it is used where it is and has no cache name"
        )
    return "--".join([*parts, digest])


def is_cache_name(name: str) -> bool:
    """Whether a directory name has the form this package gives its cache directories."""
    return bool(CACHE_NAME.match(name))


def is_pickled(name: str) -> bool:
    """Whether a file (a path, a URL) is a pickled format by its extension.

    A query or a fragment is cut first: ``model.pt?download=true`` is a pickle.
    """
    bare = name.split("#", 1)[0].split("?", 1)[0]
    suffix = PurePosixPath(bare).suffix.lower()
    return suffix in PICKLE_SUFFIXES


def pickle_refusal(source: str, files: list[str]) -> PickleRefused:
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return PickleRefused(
        f"{source}: refusing pickled weights ({shown}): a Python pickle runs whatever it "
        "holds when the engine loads it. Use a safetensors or GGUF source, or set "
        "allow_pickle: true on the model to load them on purpose"
    )


def check_named_pickle(src: Source, *, allow_pickle: bool) -> None:
    """Refuse a source whose own text names a pickled file, before any request."""
    if allow_pickle:
        return
    named = src.file or src.url or (str(src.path) if src.path else None)
    if named and is_pickled(named):
        raise pickle_refusal(src.text, [named])
