"""``llmgw ctl models explore [QUERY] [--fits] [--json]``: the hub's trending (or
searched) models, each judged by the planner against the nodes as they are now; with
``--repo ORG/REPO``, one repository's file sets, each judged, with the source that
serves it (``ctl model serve SOURCE --gpus N``).

Asks the control plane (``GET /api/v1/explore``, ``GET /api/v1/explore/{org}/{repo}``),
which asks the hub through the cluster's ``hf_endpoint``; ``--json`` prints the answer
as it came.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from llmgw.client.tables import DASH, render
from llmgw.wire.admin import ExploreJson, ExploreRepoJson, ExploreVerdictJson, JudgedByJson

GIB = 2**30
# The hub's answer and a hundred verdicts take longer than a plain admin call.
TIMEOUT = 90.0


def add_explore_parser(
    models: argparse.ArgumentParser, client_options: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``explore`` under ``ctl models`` (which alone still lists the catalog)."""
    sub = models.add_subparsers(dest="models_command", metavar="ACTION")
    p = sub.add_parser(
        "explore", help="the hub's trending or searched models, judged against the nodes now"
    )
    p.add_argument("query", nargs="?", help="words the repository's name holds")
    p.add_argument("--fits", action="store_true", help="only what fits a node now")
    p.add_argument(
        "--sort", choices=("trendingScore", "likes", "downloads"), help="default trendingScore"
    )
    p.add_argument("--limit", type=int, help="repositories asked of the hub (1 to 100)")
    p.add_argument("--repo", help="ORG/REPO: that repository's file sets, each judged")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    p.set_defaults(handler=cmd_explore)


def explore_query(args: argparse.Namespace) -> dict[str, str]:
    query: dict[str, str] = {}
    if args.query:
        query["q"] = args.query
    if args.fits:
        query["fits"] = "1"
    if args.sort:
        query["sort"] = args.sort
    if args.limit is not None:
        query["limit"] = str(args.limit)
    return query


def cmd_explore(args: argparse.Namespace) -> int:
    from llmgw.client.admin import resolve

    client = resolve(args.server, args.token, Path(args.data_dir) if args.data_dir else None)
    client = type(client)(client.base_url, client.token, timeout=TIMEOUT)
    if args.repo:
        found_repo = client.explore_repo(args.repo)
        print(json.dumps(found_repo, indent=2) if args.json else repo_text(found_repo))
        return 0
    found = client.explore(explore_query(args))
    print(json.dumps(found, indent=2) if args.json else explore_text(found))
    return 0


def _gib(value: int | None) -> str:
    return DASH if value is None else f"{value / GIB:.1f} GiB"


def _params(value: int | None) -> str:
    return DASH if value is None else f"{value / 1e9:.1f} B"


def verdict_text(v: ExploreVerdictJson) -> str:
    if v["fits"] and v["where"] == "cards":
        return f"{v['cards']} card(s) on {v['node']} ({v['nodes']} node(s))"
    if v["fits"]:
        tps = v["tokens_per_second"]
        speed = f"{tps:.1f} tok/s" if tps is not None else "speed not measured"
        return f"CPU on {v['node']}, {speed} ({v['nodes']} node(s))"
    best = v["best"]
    said = f"needs {_gib(v['needs'])}" if v["needs"] else ""
    if best is not None:
        said += (
            f"; best {best['node']}: cards {_gib(best['cards_free'])} free, "
            f"RAM {_gib(best['memory_available'])}"
        )
    return f"no: {said or v['reason'] or DASH}".rstrip()


def judged_text(by: JudgedByJson) -> str:
    card = by["largest_card"]
    ram = by["most_ram"]
    cards = (
        f"largest card {card['name']} ({_gib(card['memory'])}, capability "
        f"{card['capability'] or DASH}) on {card['node']}"
        if card
        else "no cards"
    )
    most = f"most RAM {_gib(ram['memory'])} on {ram['node']}" if ram else "no RAM read"
    return f"Judged by {by['nodes']} node(s): {cards}; {most}."


def explore_text(found: ExploreJson) -> str:
    rows = [
        [
            r["repo"],
            _params(r["parameters"]),
            r["set"] or DASH,
            _gib(r["bytes"]),
            verdict_text(r["verdict"]),
        ]
        for r in found["repos"]
    ]
    head = f"{len(found['repos'])} of {found['listed']} from {found['hub']}"
    if found["gguf_only"]:
        head += " (no node has a card: GGUF only)"
    table = render(["REPOSITORY", "PARAMS", "JUDGED AT", "SIZE", "FITS"], rows)
    return f"{judged_text(found['judged_by'])}\n{head}\n{table}"


def repo_text(found: ExploreRepoJson) -> str:
    rows = [
        [s["name"], s["source"], _gib(s["bytes"]), verdict_text(s["verdict"])]
        for s in found["sets"]
    ]
    lines = [judged_text(found["judged_by"]), f"{found['repo']}: {_params(found['parameters'])}"]
    if found["note"]:
        lines.append(found["note"])
    if rows:
        lines.append(render(["SET", "SOURCE", "SIZE", "FITS"], rows))
    return "\n".join(lines)
