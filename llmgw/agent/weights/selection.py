"""Which files of a repository a source means.

- A quantisation picks the GGUF whose path carries it as a whole word (``Q4_K`` is not
  ``Q4_K_M``, ``Q4_XS`` is not ``IQ4_XS``), case-insensitive, leaving out multimodal
  projectors (``mmproj-*``); a split GGUF comes with all its parts. More than one match
  is ambiguous and names the candidates.
- A file comes alone, or with its sibling parts when it is one part of a split GGUF.
- A whole repository means its safetensors with the JSON and tokenizer files beside
  them; never the ``training_args.bin`` or ``optimizer.pt`` pickles such repositories
  often also hold. Only where a repository has no safetensors at all are its pickled
  weights chosen, for the pickle rule to refuse unless the model allows them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from llmgw.agent.weights.errors import HubError, HubNotFound, SourceError
from llmgw.agent.weights.hub import HubFile
from llmgw.sources import Source, is_pickled, repo_path_problem

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# Files a transformers-layout model needs beside its weights; all plain data.
_AUX_NAMES = frozenset({"tokenizer.model", "merges.txt", "vocab.txt", "spiece.model"})
_AUX_SUFFIXES = (".json", ".tiktoken", ".jinja")


@dataclass(frozen=True)
class Selection:
    """The files to fetch, and the one the engine is given (``""``: the directory)."""

    files: list[HubFile]
    entry: str


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


def _is_projector(path: str) -> bool:
    return PurePosixPath(path).name.lower().startswith("mmproj")


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
        return Selection(files=files, entry=files[0].path)
    if source.quant is not None:
        pattern = _quant_pattern(source.quant)
        matches = [f for f in ggufs if pattern.search(f.path) and not _is_projector(f.path)]
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
        return Selection(files=files, entry=files[0].path)
    return _whole_repository(source, listing, ggufs)


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
