"""``llmgw ctl fabrics`` and ``llmgw ctl fabric-test A B``: the InfiniBand fabrics the
nodes' ports see, and the bandwidth between two nodes, rail by rail."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands
from llmgw.client.tables import render
from llmgw.wire.admin import FabricsJson, FabricTestJson


def fabrics_text(doc: FabricsJson) -> str:
    out: list[str] = []
    for f in doc.get("fabrics") or []:
        states = ", ".join(f"{n} {s}" for s, n in (f.get("ports_by_state") or {}).items())
        master = f.get("master_sm") or "/".join(f.get("masters") or []) or "-"
        out.append(
            f"fabric {f['id']}: master SM {master}; {len(f.get('subnet_managers') or [])} "
            f"SM(s); {len(f.get('nodes') or [])} node(s); ports {states or '-'}"
        )
        out += [f"  ! {p}" for p in f.get("problems") or []]
    for net in doc.get("roce_networks") or []:
        out.append(f"RoCE {net['network']}: {', '.join(net.get('nodes') or [])}")
    lost = doc.get("unassigned_ports") or []
    if lost:
        shown = ", ".join(f"{p['node']} {p['device']}/{p['port']}" for p in lost)
        out.append(f"active InfiniBand ports whose master SM could not be read: {shown}")
    return "\n".join(out) or "No node reports an InfiniBand or RoCE port."


def test_table(doc: FabricTestJson) -> str:
    rows = [
        [
            str(r["rail"]),
            f"{doc['a']} {r['a_device']}",
            f"{doc['b']} {r['b_device']}",
            "-" if r.get("rate_gbps") is None else f"{r['rate_gbps']:g}",
            "-" if r.get("gbps") is None else f"{r['gbps']:.1f}",
            "-" if (ratio := r.get("ratio")) is None else f"{100 * ratio:.0f}%",
            str(r["grade"]) + (f": {r['error']}" if r.get("error") else ""),
        ]
        for r in doc.get("rails") or []
    ]
    if not rows:
        return "No rail could be paired (no active adapters on one side)."
    return render(["RAIL", "A", "B", "LINK GB/S", "MEASURED GB/S", "OF LINK", "GRADE"], rows)


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show(args: argparse.Namespace) -> int:
        doc = client(args).fabrics()
        print(json.dumps(doc, indent=2) if args.json else fabrics_text(doc))
        return 0

    def test(args: argparse.Namespace) -> int:
        body = {"a": args.a, "b": args.b, "seconds": args.seconds}
        result = client(args).fabric_test(body)
        print(json.dumps(result, indent=2) if args.json else test_table(result))
        return 0 if all(r["grade"] in ("good", "fair") for r in result["rails"]) else 1

    p = ctl_cmds.add_parser("fabrics", help="the InfiniBand fabrics, their SMs and problems")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    p.set_defaults(handler=show)
    p = ctl_cmds.add_parser(
        "fabric-test", help="ib_write_bw from A to B, adapter by adapter, graded"
    )
    p.add_argument("a", help="the node that runs the clients")
    p.add_argument("b", help="the node that runs the servers")
    p.add_argument("--seconds", type=int, default=5, help="seconds per rail (default 5)")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    p.set_defaults(handler=test)
