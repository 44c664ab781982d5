"""``llmgw server join`` and ``llmgw server promote``: run on a control plane's machine,
with its data dir."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from pathlib import Path

from llmgw import pki
from llmgw.cliargs import UsageError
from llmgw.config import format_hostport
from llmgw.jsonvalue import as_object
from llmgw.server.datadir import DataDir, InitError
from llmgw.server.ha.follower import LEADER_SETTING, TERM_SETTING, store_term
from llmgw.server.ha.joining import JoinError, join
from llmgw.server.ha.peerlink import PeerClient, PeerError
from llmgw.server.store import SQLiteStore, open_store


def cmd_join(args: argparse.Namespace, root: Path) -> int:
    try:
        config = join(
            root,
            args.server,
            args.token,
            name=args.name,
            listen=args.listen or "0.0.0.0:8080",
            agent_port=args.agent_port or 8443,
            peer_port=args.peer_port or 8444,
            advertise=args.advertise or None,
        )
    except (JoinError, InitError) as exc:
        raise UsageError(str(exc)) from None
    print(f"Joined the cluster as control plane {config.ha.name}, a standby of {args.server}")
    print(f"  data dir: {root}")
    print(f"  HTTP (/v1, /api/v1): {config.listen}; agents' port {config.agent_port}; ")
    print(f"  control planes' link: port {config.ha.peer_port}, following {config.ha.leader}")
    print(f"Next: llmgw server run --data-dir {root}")
    return 0


def cmd_promote(args: argparse.Namespace, root: Path) -> int:
    answer = asyncio.run(promote(root, args.force))
    print(
        f"{answer['name']} leads now, with term {answer['term']}"
        + (
            " (it was not running: the role is taken when it starts)"
            if answer.get("offline")
            else ""
        )
    )
    return 0


async def promote(root: Path, force: bool) -> Mapping[str, object]:
    """Ask the running control plane of ``root`` to lead; when it does not run, write its
    store and server.yaml so it leads when it starts."""
    data = DataDir(root)
    config = data.load_config()
    if config.store.backend != "sqlite":
        raise UsageError(
            "the store is PostgreSQL: leadership moves by itself (the leader's lease); stop "
            "the leader and another control plane takes over within ha.lease_seconds"
        )
    if config.ha.role == "leader":
        raise UsageError(f"{config.ha.name or root} already leads (server.yaml: role leader)")
    client = PeerClient(pki.peer_tls(data.peer_cert, data.peer_key, data.ca_cert, server=False))
    try:
        own = format_hostport("127.0.0.1", config.ha.peer_port)
        try:
            return as_object(
                await client.json("POST", own, "/peer/promote", {"force": force}, timeout=30)
            )
        except PeerError as exc:
            if exc.status is not None:
                raise UsageError(str(exc)) from None
        # Not running: the old leader must not answer as leader either.
        if config.ha.leader and not force:
            try:
                found = await client.json("GET", config.ha.leader, "/peer/state", timeout=3)
            except PeerError:
                found = None
            state = found if isinstance(found, dict) else {}
            if state.get("role") == "leader":
                raise UsageError(
                    f"{state.get('name')} at {config.ha.leader} still answers as leader (term "
                    f"{state.get('term')}): stop it first, or promote with --force"
                )
    finally:
        await client.close()
    store = await open_store(config, root)
    try:
        assert isinstance(store, SQLiteStore)
        term = await store_term(store) + 1
        await store.put_setting(TERM_SETTING, str(term))
        await store.put_setting(LEADER_SETTING, config.ha.name)
        await store.audit("llmgw server promote", "server.promote", config.ha.name, f"term {term}")
    finally:
        await store.close()
    data.remember_role("leader", None)
    return {"name": config.ha.name, "role": "leader", "term": term, "offline": True}
