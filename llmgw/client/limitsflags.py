"""The flags of ``llmgw ctl keys limits`` and ``llmgw ctl limits set`` (one set for a
key and for an organisation, team or project), the body they make, and how limits,
tool grants and what a revoke changed read as text.

``--tools jira.*,wiki.get`` grants those tools; ``--tools ''`` closes the level or key
to every tool (``[]``); ``--clear tools`` opens it again (it says nothing of tools).
``--revoke-tools SERVER`` takes every pattern reaching that MCP server from it and from
every level and key beneath it.
"""

from __future__ import annotations

import argparse

from llmgw.client import UsageError
from llmgw.wire.admin import LimitsJson, LimitsSetJson, McpGrantJson

DASH = "-"
LIMITS = ("rpm", "tpm", "budget", "models", "tools", "guard")
CLOSED = "closed: no tool until `--clear tools` opens it"


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rpm", type=int, help="requests a minute")
    p.add_argument("--tpm", type=int, help="tokens a minute")
    p.add_argument("--budget", type=int, help="tokens a month")
    p.add_argument("--models", help="model name patterns it may use, comma-separated")
    p.add_argument(
        "--tools",
        help="MCP tools granted, SERVER.TOOL patterns comma-separated (jira.*,wiki.get); "
        "'' closes it to every tool",
    )
    p.add_argument(
        "--guard", help="guard policies that read what its keys send and get, comma-separated"
    )
    p.add_argument(
        "--revoke-tools",
        metavar="SERVER",
        help="take that MCP server's tools from it and from every level and key beneath it",
    )
    p.add_argument("--clear", help="limits to lift, comma-separated: " + ",".join(LIMITS))


def _listed(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def limits_body(args: argparse.Namespace) -> dict[str, object]:
    """The API's body for the flags given; a UsageError when none says anything."""
    body: dict[str, object] = {
        k: v for k in ("rpm", "tpm", "budget") if (v := getattr(args, k)) is not None
    }
    for name in ("models", "tools", "guard"):
        value = getattr(args, name)
        if value is not None:
            body[name] = _listed(value)
    if args.revoke_tools is not None:
        body["revoke_tools"] = args.revoke_tools
    if args.clear:
        clear = _listed(args.clear)
        unknown = [c for c in clear if c not in LIMITS]
        if unknown:
            raise UsageError(
                f"--clear: {', '.join(unknown)} is not a limit (they are: {', '.join(LIMITS)})"
            )
        body["clear"] = clear
    if not body:
        raise UsageError(
            "say what to set: --rpm, --tpm, --budget, --models, --tools, --guard, "
            "--revoke-tools or --clear"
        )
    return body


def _n(value: int | None) -> str:
    return DASH if value is None else str(value)


def tools_cell(tools: list[str] | None) -> str:
    """A tool grant in a table: "none" (says nothing), "closed", or the patterns."""
    if tools is None:
        return "none"
    return ",".join(tools) or "closed"


def limits_text(limits: LimitsJson) -> str:
    models = ",".join(limits["models"]) or "all"
    text = (
        f"rpm {_n(limits['rpm'])}, tpm {_n(limits['tpm'])}, budget {_n(limits['budget'])}, "
        f"models {models}, tools {tools_cell(limits['tools'])}, "
        f"guard {','.join(limits['guard']) or 'none'}"
    )
    if limits["tools"] == []:
        text += f"\n{CLOSED}"
    return text


def grant_line(grant: McpGrantJson) -> str:
    if grant["closed"]:
        return f"{grant['label']}: {CLOSED}"
    return f"{grant['label']}: tools {','.join(grant['patterns'])}"


def set_text(where: str, answer: LimitsSetJson) -> str:
    """The answer to setting limits, with what a revoke took from beneath."""
    lines = [f"{where}: {limits_text(answer)}"]
    if answer["revoked"]:
        lines.append("revoked beneath it:")
        lines += [f"  {grant_line(g)}" for g in answer["revoked"]]
    return "\n".join(lines)
