"""A real control plane (its admin app in process, its SQLite store) with fake agents
registered on it, for the Slurm service's and keeper's tests: each node is a
``FakeSession`` that records what it is sent, and the test says what its agent reports
(its shards, its SlurmStatus) as the agent's stream would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.server.app import ControlPlane
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.datadir import DataDir, init
from llmgw.server.store import open_store
from llmgw.wire.messages import (
    EngineInfo,
    Register,
    ShardStatus,
    Slurm,
    SlurmdFacts,
    SlurmJob,
    SlurmStatus,
)
from llmgw.wire.states import ShardState
from tests.support import nodefacts
from tests.support.agentsession import FakeSession

GIB = 1024**3


@dataclass
class Plane:
    cp: ControlPlane
    client: httpx.AsyncClient
    root: Path

    async def node(self, node_id: str, address: str, cpus: int = 16) -> FakeSession:
        """A node enrolled and registered: Ready, llama.cpp installed, 64 GiB."""
        return await register_node(self.cp, node_id, address, cpus)

    def slurm(self, node_id: str, **said: Any) -> None:
        """What the node's agent reports of Slurm (its SlurmStatus)."""
        report_slurm(self.cp, node_id, **said)

    def serve(self, name: str = "m") -> Model:
        """A llama.cpp model of one replica of 1 GiB, in the catalog."""
        profile = Profile(name="default", engine="llama.cpp", replicas=1, memory=GIB)
        model = Model(
            name=name,
            source=f"/models/{name}.gguf",
            engine="llama.cpp",
            profiles=(profile,),
            context=512,
        )
        self.cp.models.models[name] = model
        return model

    def report_shard(self, node_id: str, replica_id: str, state: ShardState) -> None:
        self.cp.registry.report(
            node_id, ShardStatus(replica_id=replica_id, state=state, fingerprint=None)
        )


async def register_node(
    cp: ControlPlane, node_id: str, address: str, cpus: int = 16
) -> FakeSession:
    """A node enrolled and registered: Ready, llama.cpp installed, 64 GiB."""
    await cp.registry.enrolled(node_id, 1)
    session = FakeSession()
    version = cp.engines.version_of("llama.cpp") or "b4321"
    host = nodefacts.facts(
        hostname=node_id,
        cpu_count=cpus,
        memory_total=64 * GIB,
        memory_available=64 * GIB,
        gpus=[],
    )
    await cp.registry.register(
        Register(
            node_id=node_id,
            version="test",
            host=host,
            address=address,
            engines=[EngineInfo(name="llama.cpp", path="/x", version=version)],
            engines_probed=True,
        ),
        session,
    )
    return session


def report_slurm(
    cp: ControlPlane,
    node_id: str,
    state: str | None = "IDLE+DRAIN",
    reason: str | None = "llmgw: not lent",
    jobs: list[SlurmJob] | None = None,
    steps: int | None = 0,
    installed: str | None = "22.05.8",
    problem: str | None = None,
    cgroup_v2: bool | None = False,
) -> None:
    """What the node's agent reports of Slurm (its SlurmStatus)."""
    cp.registry.report(
        node_id,
        SlurmStatus(
            version=cp.slurm.kept.now.version,
            part=cp.slurm.service.part_of(node_id),
            installed=installed,
            facts=SlurmdFacts(
                cpus=4,
                sockets_per_board=1,
                cores_per_socket=2,
                threads_per_core=2,
                real_memory=7900,
            ),
            state=state,
            reason=reason,
            jobs=[] if jobs is None else jobs,
            steps=steps,
            problem=problem,
            cgroup_v2=cgroup_v2,
        ),
    )


def slurm_sent(session: FakeSession) -> list[Slurm]:
    return [m for m in session.sent if isinstance(m, Slurm)]


@pytest.fixture
def slurm_data(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "data"
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root, token


@pytest.fixture
async def plane(slurm_data: tuple[Path, str]) -> AsyncIterator[Plane]:
    root, token = slurm_data
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    await cp.load()
    transport = httpx.ASGITransport(app=cp.admin_app())
    headers = {"authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://cp", headers=headers
        ) as client:
            yield Plane(cp, client, root)
    finally:
        await cp.gateway.close()
        await cp.inspector.close()
        await store.close()
