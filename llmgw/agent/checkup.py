"""``llmgw doctor``: this machine's hardware checks and, on a node, its link to the cluster.

The link checks use the agent's own state dir: the route to the control plane (which
local address the agent would use) and a real mutual-TLS handshake with its certificate,
so a firewall, a wrong address or a certificate the control plane no longer trusts shows
up here, with its fix, rather than as a node that never turns Ready.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import socket
import ssl
from dataclasses import asdict
from pathlib import Path

from cryptography import x509

from llmgw import pki
from llmgw.agent.cardchecks import card_checks
from llmgw.agent.clustersettings import summary
from llmgw.agent.discovery import Discovery
from llmgw.agent.doctor import Check, clock_check, hardware_checks
from llmgw.agent.engines.converge import load_wanted
from llmgw.agent.firewall import FirewallError, Nft, available, load_plan
from llmgw.agent.identity import AgentState, default_node_id
from llmgw.config import default_state_dir, parse_hostport

CERT_WARN_DAYS = 30


def route_check(address: str) -> tuple[Check, str | None]:
    """Which local address reaches the control plane, without sending anything."""
    host, port = parse_hostport(address)
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as s:
            s.connect(info[4])
            local = str(s.getsockname()[0])
    except OSError as exc:
        return Check(
            "route",
            "fail",
            f"no route to the control plane at {address}: {exc}",
            "check the address in the state dir's state.yaml and this machine's "
            "network (ip route get ADDRESS)",
        ), None
    return Check("route", "ok", f"{address} is reached from {local}"), local


async def tls_check(state: AgentState, address: str, timeout: float = 5.0) -> Check:
    """A real handshake with the node's certificate, as the agent makes it."""
    host, port = parse_hostport(address)
    try:
        ctx = pki.client_tls(state.cert_path, state.key_path, state.ca_path)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, server_hostname=host), timeout
        )
    except ssl.SSLCertVerificationError as exc:
        return Check(
            "tls",
            "fail",
            f"{address} presented a certificate this node does not trust: {exc.verify_message}",
            "the node was enrolled with another control plane; make a token with "
            "`llmgw node token` there and run `llmgw agent run --token` again with a "
            "fresh state dir",
        )
    except (OSError, TimeoutError) as exc:
        return Check(
            "tls",
            "fail",
            f"cannot connect to the agents' port {address}: {exc or 'timed out'}",
            "start the control plane (`llmgw server run`) and open the agents' port "
            "in any firewall between",
        )
    try:
        alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        # With TLS 1.3 the server judges our certificate after the client's handshake ends;
        # its refusal arrives on the first read.
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        data = await asyncio.wait_for(reader.read(64), timeout)
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        data, alpn = b"", f"refused ({exc})"
    finally:
        writer.close()
    if not data:
        return Check(
            "tls",
            "fail",
            f"{address} refused this node's certificate ({alpn or 'closed'})",
            "the node was removed or enrolled again elsewhere; enroll it again with a "
            "new token and a fresh state dir",
        )
    return Check("tls", "ok", f"mutual TLS with {address}: trusted both ways, HTTP/2 ({alpn})")


def cert_check(state: AgentState) -> Check:
    cert = x509.load_pem_x509_certificate(state.cert_path.read_bytes())
    left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    if left.days < CERT_WARN_DAYS:
        return Check(
            "certificate",
            "warn" if left.days >= 0 else "fail",
            f"node certificate expires {cert.not_valid_after_utc:%Y-%m-%d}",
            "enroll the node again with a new token",
        )
    return Check(
        "certificate",
        "ok",
        f"node {state.node_id}, valid until {cert.not_valid_after_utc:%Y-%m-%d}",
    )


def installed_engines(state_dir: Path) -> dict[str, list[str]]:
    """The installs the agent marked, by engine: ``b2 (cpu)`` (read, not run again)."""
    found: dict[str, list[str]] = {}
    for marker in sorted((state_dir / "engines").glob("*/*/installed.json")):
        try:
            doc = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        engine = marker.parent.parent.name
        found.setdefault(engine, []).append(f"{doc.get('version')} ({doc.get('build')})")
    return found


def engines_check(state_dir: Path) -> Check:
    """The engines this node has against the ones the fleet last asked of it."""
    have = installed_engines(state_dir)
    wish = load_wanted(state_dir)
    shown = "; ".join(f"{e} {', '.join(v)}" for e, v in sorted(have.items())) or "none installed"
    if wish is None:
        return Check("engines", "ok", f"{shown}; the fleet has named none to this node yet")
    wanted = wish.get("engines") or {}
    behind = [
        f"{name} {want.get('version')}"
        for name, want in sorted(wanted.items())
        if not any(v.startswith(f"{want.get('version')} ") for v in have.get(name, []))
    ]
    head = f"{shown}; the fleet wants " + (
        ", ".join(f"{n} {w.get('version')}" for n, w in sorted(wanted.items())) or "none"
    )
    head += f" (build {wish.get('build', 'auto')})"
    if not behind:
        return Check("engines", "ok", head)
    return Check(
        "engines",
        "warn",
        f"{head}; not here yet: {', '.join(behind)}",
        "the agent installs them in the background; `llmgw ctl engines` shows its words "
        "(an engine named in agent.yaml, or llamacpp_version, keeps this node apart)",
    )


def firewall_check(state_dir: Path) -> Check | None:
    """llmgw's nftables table against the plan the cluster last sent; None without one."""
    try:
        plan = load_plan(state_dir)
    except FirewallError as exc:
        return Check(
            "firewall", "fail", str(exc), "`llmgw firewall sync` after the agent reconnects"
        )
    if plan is None:
        return None
    if not available():
        words = (
            "the cluster keeps no table here"
            if not plan.enabled
            else (
                "the cluster asks for llmgw's table, but only an agent running as root "
                "with nft (nftables) keeps it"
            )
        )
        return Check("firewall", "ok" if not plan.enabled else "warn", words)
    status = Nft().status(plan)
    if status.get("in_sync"):
        words = "llmgw's table is loaded as the cluster asks" if plan.enabled else "off"
        return Check("firewall", "ok", words)
    return Check(
        "firewall",
        "fail",
        str(status.get("problem") or "llmgw's table is not as the cluster asks"),
        "`llmgw firewall sync` loads it again; `llmgw firewall status` shows the rules",
    )


async def gather_checks(state_dir: Path | None) -> list[Check]:
    state = AgentState.load(state_dir) if state_dir else None
    dirs = [state_dir] if state_dir and state_dir.exists() else []
    discovery = Discovery(dirs)
    try:
        facts = await discovery.facts(
            state.node_id if state and state.node_id else default_node_id()
        )
        live = await discovery.live() if facts.gpus else None
    finally:
        await discovery.close()
    checks = hardware_checks(facts)
    if live is not None and live.gpus:
        checks += card_checks(
            live.gpus,
            live.gpu_health or [],
            live.health_warnings or [],
            facts.cuda_version,
            discovery.reads_kernel_log,
        )
    checks.append(await asyncio.to_thread(clock_check))
    if state_dir is not None and state_dir.exists():
        good, detail = summary(state_dir)
        fix = None if good else "fix agent.yaml, or the cluster's value with `llmgw ctl config`"
        checks.append(Check("settings", "ok" if good else "fail", detail, fix))
        checks.append(engines_check(state_dir))
        wall = await asyncio.to_thread(firewall_check, state_dir)
        if wall is not None:
            checks.append(wall)
    if state is not None and state.enrolled() and state.control_planes:
        checks.append(cert_check(state))
        address = state.control_planes[0]
        route, _ = route_check(address)
        checks.append(route)
        if route.status == "ok":
            checks.append(await tls_check(state, address))
    return checks


def run_doctor(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    checks = asyncio.run(gather_checks(state_dir if state_dir.exists() else None))
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{marks[c.status]}  {c.name.ljust(width)}  {c.detail}")
            if c.fix and c.status != "ok":
                print(f"      {' ' * width}  fix: {c.fix}")
    return 1 if any(c.status == "fail" for c in checks) else 0
