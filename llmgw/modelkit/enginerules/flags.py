"""Reading a profile's arguments the way each engine will, so a refused flag is refused
in every spelling the engine accepts.

Two parsers matter. llama.cpp looks each argument up exactly (after turning ``_`` into
``-`` in ``--`` flags), so ``--chat-template`` is its own flag and not a spelling of
``--chat-template-file``. vLLM and SGLang use Python's argparse, which also takes any
unambiguous beginning of a long option (``--trust-remote`` is ``--trust-remote-code``)
and a single-dash option's beginning (``-t`` is vLLM's ``-tp``). ``resolve_option``
answers as argparse would; the refusal rule built on it is in ``ArgparseFlags``.

We also read ``--flag=value``, ``-f=value`` and vLLM's dotted ``--flag.key value``
forms as the flag, whichever engine, since reading more spellings as the flag only
ever refuses an argument the engine would have had to parse as that flag or reject.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence


def _key(arg: str) -> str:
    """The option part of an argument: before ``=``; for ``--`` flags with dashes for
    underscores (vLLM's parser and llama.cpp's both do that) and without vLLM's dotted
    sub-keys (``--compilation-config.level``)."""
    key = arg.split("=", 1)[0]
    if key.startswith("--"):
        key = "--" + key[2:].replace("_", "-").split(".", 1)[0]
    return key


def resolve_option(arg: str, options: Collection[str]) -> tuple[str, ...]:
    """The options argparse (``allow_abbrev=True``) would read ``arg`` as.

    One option for an exact or unambiguous match; several when the beginning is
    ambiguous (argparse stops with "ambiguous option"); none when ``arg`` is not an
    option we know of (a value, a positional, or a flag missing from ``options``).
    Both Python 3.11's and 3.12's readings of ``-x=value`` are taken together.
    """
    if len(arg) < 2 or not arg.startswith("-") or arg == "--":
        return ()
    key = _key(arg)
    if key in options:
        return (key,)
    if key.startswith("--"):
        return tuple(sorted(o for o in options if o.startswith(key)))
    # A single-dash argument: "-Xvalue" when "-X" is an option, or the beginning of a
    # longer single-dash option ("-t" for "-tp").
    found = {o for o in options if o == arg[:2] or (not o.startswith("--") and o.startswith(key))}
    return tuple(sorted(found))


class ExactFlags:
    """Refused flags for a parser that looks arguments up exactly (llama.cpp)."""

    def __init__(self, refused: Iterable[str]) -> None:
        self.refused = frozenset(refused)

    def refused_flag(self, args: Sequence[str]) -> str | None:
        for arg in args:
            if not arg.startswith("-"):
                continue
            # A dot may be part of llama.cpp's own flag (--fim-qwen-1.5b-default), and is
            # read as vLLM's sub-key too: refused either way.
            whole = arg.split("=", 1)[0]
            if whole.startswith("--"):
                whole = "--" + whole[2:].replace("_", "-")
            if whole in self.refused or _key(arg) in self.refused:
                return arg
        return None


class ArgparseFlags:
    """Refused flags for an engine that parses with argparse (vLLM, SGLang).

    ``options`` is the engine's list of flags, refused or not, so that a beginning is
    judged ambiguous or unique as the engine judges it. An argument is refused when
    argparse could read it as a refused flag: exactly, as a unique beginning, or as an
    ambiguous beginning one of whose readings is refused. The last is refused rather
    than left to argparse's error because an older engine, missing the other option,
    would read that beginning as the refused flag alone. A flag that matches a
    harmless option exactly always passes, as argparse prefers the exact match.

    ``allowed_values`` lets a refused flag through with the values named (vLLM's
    ``--generation-config auto`` reads no file; a path would).
    """

    def __init__(
        self,
        options: Iterable[str],
        refused: Iterable[str],
        allowed_values: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        self.refused = frozenset(refused)
        self.options = frozenset(options) | self.refused
        self.allowed_values = dict(allowed_values or {})

    def refused_flag(self, args: Sequence[str]) -> str | None:
        for i, arg in enumerate(args):
            readings = resolve_option(arg, self.options)
            hits = [r for r in readings if r in self.refused]
            if not hits:
                continue
            if len(readings) == 1 and hits[0] in self.allowed_values:
                value = arg.split("=", 1)[1] if "=" in arg else _next(args, i)
                if value in self.allowed_values[hits[0]]:
                    continue
            return arg
        return None


def _next(args: Sequence[str], i: int) -> str | None:
    return args[i + 1] if i + 1 < len(args) else None
