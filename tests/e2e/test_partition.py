"""A leader cut from the store by the network: network namespaces and nftables.

Control plane a runs in a network namespace of its own, joined to this machine by a veth
pair (10.214.N.2 there, 10.214.N.1 here); it reaches the PostgreSQL store through a relay
on 10.214.N.1, and control plane b, on this machine, reaches the store directly. An
nftables rule in a's namespace then drops every packet to the store: a partition as a
network makes one, silent, while a and b still reach each other. a must stop leading
within the lease time, b take over, and the two never lead at once; when the rule goes,
a follows b.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.catalog import SCHEDULING
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.standbys import leader_state
from tests.e2e.test_ha_postgres import Proxy, pg  # noqa: F401 (the module's store)
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.e2e

_tags = itertools.count()


def sh(*argv: str) -> None:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {out.stderr or out.stdout}")


class Namespace:
    """A network namespace with a veth pair to this machine: ``inside`` and ``outside``
    are the two ends' addresses."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 1000}{next(_tags)}"
        subnet = 100 + int(tag) % 150
        self.name = f"llmgw-part-{tag}"
        self.inside, self.outside = f"10.214.{subnet}.2", f"10.214.{subnet}.1"
        host_if, ns_if = f"lgwp{tag}h", f"lgwp{tag}n"
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", self.name)
        sh("ip", "addr", "add", f"{self.outside}/24", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", self.name, "addr", "add", f"{self.inside}/24", "dev", ns_if)
        sh("ip", "-n", self.name, "link", "set", ns_if, "up")
        sh("ip", "-n", self.name, "link", "set", "lo", "up")
        self.host_if = host_if

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def drop_to(self, address: str, port: int) -> None:
        """Drop, silently, every packet from inside to ``address:port``."""
        sh("ip", "netns", "exec", self.name, "nft", "add", "table", "inet", "llmgw")
        sh(
            "ip", "netns", "exec", self.name, "nft", "add", "chain", "inet", "llmgw", "out",
            "{ type filter hook output priority 0 ; }",
        )  # fmt: skip
        sh(
            "ip", "netns", "exec", self.name, "nft", "add", "rule", "inet", "llmgw", "out",
            "ip", "daddr", address, "tcp", "dport", str(port), "drop",
        )  # fmt: skip

    def heal(self) -> None:
        sh("ip", "netns", "exec", self.name, "nft", "delete", "table", "inet", "llmgw")

    def remove(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=20)


@pytest.fixture
def ns() -> Iterator[Namespace]:
    space = Namespace()
    try:
        yield space
    finally:
        space.remove()


def test_a_leader_cut_from_the_store_by_the_network_steps_down(
    pg: PostgresServer,  # noqa: F811
    ns: Namespace,
    tmp_path: Path,
) -> None:
    dbname = f"llmgw_part_{int(time.time())}"
    pg.create_database(dbname)
    relay = Proxy(pg.port, listen=ns.outside)
    try:
        through = pg.dsn(dbname).replace(f"host={pg.host}", f"host={ns.outside}")
        through = through.replace(f"port={pg.port}", f"port={relay.port}")
        a = Cluster(
            tmp_path / "a",
            host=ns.inside,
            server_prefix=ns.prefix,
            init_args=["--store", "postgres", "--dsn", through],
        )
        b = Cluster(tmp_path / "b", name="cp-b", host=ns.outside)
        for c in (a, b):
            c.root.mkdir(parents=True)
        try:
            a.init()
            (a.data_dir / "server.yaml").write_text(
                (a.data_dir / "server.yaml").read_text() + SCHEDULING
            )
            a.start_server()
            wait_for(lambda: leader_state(a)[0] == 200, 15, "a to take the lease")
            b.join_as_standby(a)
            config = b.data_dir / "server.yaml"
            config.write_text(config.read_text().replace(through, pg.dsn(dbname)) + SCHEDULING)
            b.start_server()
            wait_for(lambda: leader_state(b)[1]["leader"]["name"] == "cp-a", 15, "b to follow")

            ns.drop_to(ns.outside, relay.port)
            cut = time.monotonic()
            seen: list[tuple[float, bool, bool]] = []

            def roles() -> bool:
                now = (leader_state(a)[0] == 200, leader_state(b)[0] == 200)
                seen.append((round(time.monotonic() - cut, 2), *now))
                return now == (False, True)

            wait_for(roles, 25, "a to step down and b to lead", step=0.2)
            stepped = next(t for t, at_a, _ in seen if not at_a)
            assert stepped <= 10, seen  # within the lease time
            assert not any(at_a and at_b for _, at_a, at_b in seen), seen

            # The network heals: a reaches the store again and follows b's lease.
            ns.heal()
            wait_for(
                lambda: (leader_state(a)[1].get("leader") or {}).get("name") == "cp-b",
                15,
                "a to follow b",
            )
            assert leader_state(a)[0] == 503 and leader_state(b)[0] == 200
        finally:
            b.stop()
            a.stop()
    finally:
        relay.close()
