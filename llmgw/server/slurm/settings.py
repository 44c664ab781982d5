"""Slurm beside llmgw as the cluster decides it: one JSON document in the store's
settings (``slurm``), written with its audit entry, as the firewall's is.

It holds what ``llmgw ctl slurm`` set (on or off, the controller's node, the partition,
the nodes Slurm may be lent, the ports and root), the cluster's munge key (sealed with
the cluster secret: made once at the first setup and kept across off and setup, so the
nodes' keys never change under a running Slurm), the nodes wanted in Slurm (``lend``),
those being taken back (``reclaim``), the nodes llmgw cordoned for Slurm (only those are
uncordoned when they come back) and the policy. ``version`` is bumped by every change.

A standby reads the same document when its copy of the store changes, so the leader it
may become carries on a lend or reclaim where the last one left it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

from llmgw import pki
from llmgw.jsonvalue import JSONObject
from llmgw.server.principal import Principal
from llmgw.server.store import Store

SETTING = "slurm"
# The munge key's size: munge's own `mungekey` makes 1024 bytes.
MUNGE_KEY_BYTES = 1024
DEFAULT_PARTITION = "llmgw"
DEFAULT_CTLD_PORT = 6817
DEFAULT_SLURMD_PORT = 6818


@dataclass(frozen=True)
class SlurmPolicy:
    """Lending by policy (``ctl slurm policy``); off while both durations are None."""

    lend_idle_after: float | None = None
    keep_free_gpus: int = 0
    reclaim_when_queued: float | None = None

    @property
    def on(self) -> bool:
        return self.lend_idle_after is not None or self.reclaim_when_queued is not None


@dataclass(frozen=True)
class SlurmSettings:
    enabled: bool = False
    controller: str | None = None
    partition: str = DEFAULT_PARTITION
    # None: every node, new ones included.
    nodes: tuple[str, ...] | None = None
    ctld_port: int = DEFAULT_CTLD_PORT
    slurmd_port: int = DEFAULT_SLURMD_PORT
    root: str = ""
    # pki.seal(cluster_secret, key); never shown, never logged.
    munge_key: str | None = field(default=None, repr=False)
    lend: tuple[str, ...] = ()
    reclaim: tuple[str, ...] = ()
    cordoned: tuple[str, ...] = ()
    policy: SlurmPolicy = SlurmPolicy()
    # `ctl slurm off` without --now: Slurm is turned off once nothing is left reclaiming.
    turning_off: bool = False
    version: int = 0

    def in_set(self, node_id: str) -> bool:
        """Whether the node is one Slurm may be lent (while Slurm is on)."""
        return self.enabled and (self.nodes is None or node_id in self.nodes)

    def document(self) -> JSONObject:
        return {
            "enabled": self.enabled,
            "controller": self.controller,
            "partition": self.partition,
            "nodes": None if self.nodes is None else list(self.nodes),
            "ctld_port": self.ctld_port,
            "slurmd_port": self.slurmd_port,
            "root": self.root,
            "munge_key": self.munge_key,
            "lend": list(self.lend),
            "reclaim": list(self.reclaim),
            "cordoned": list(self.cordoned),
            "policy": {
                "lend_idle_after": self.policy.lend_idle_after,
                "keep_free_gpus": self.policy.keep_free_gpus,
                "reclaim_when_queued": self.policy.reclaim_when_queued,
            },
            "turning_off": self.turning_off,
            "version": self.version,
        }

    @classmethod
    def read(cls, doc: JSONObject) -> SlurmSettings:
        """The settings from their document; what is missing or of the wrong type takes
        its default (a document written by an older llmgw)."""

        def names(value: object) -> tuple[str, ...]:
            if isinstance(value, list):
                return tuple(str(v) for v in value if isinstance(v, str))
            return ()

        def number(value: object) -> float | None:
            return float(value) if isinstance(value, int | float) else None

        def whole(value: object, default: int) -> int:
            return value if isinstance(value, int) and value else default

        found = doc.get("policy")
        policy = found if isinstance(found, dict) else {}
        nodes = doc.get("nodes")
        controller = doc.get("controller")
        key = doc.get("munge_key")
        return cls(
            enabled=doc.get("enabled") is True,
            controller=controller if isinstance(controller, str) else None,
            partition=str(doc.get("partition") or DEFAULT_PARTITION),
            nodes=names(nodes) if isinstance(nodes, list) else None,
            ctld_port=whole(doc.get("ctld_port"), DEFAULT_CTLD_PORT),
            slurmd_port=whole(doc.get("slurmd_port"), DEFAULT_SLURMD_PORT),
            root=str(doc.get("root") or ""),
            munge_key=key if isinstance(key, str) else None,
            lend=names(doc.get("lend")),
            reclaim=names(doc.get("reclaim")),
            cordoned=names(doc.get("cordoned")),
            policy=SlurmPolicy(
                lend_idle_after=number(policy.get("lend_idle_after")),
                keep_free_gpus=whole(policy.get("keep_free_gpus"), 0),
                reclaim_when_queued=number(policy.get("reclaim_when_queued")),
            ),
            turning_off=doc.get("turning_off") is True,
            version=whole(doc.get("version"), 0),
        )


class KeptSlurm:
    """The settings in memory, read from and written to the store."""

    def __init__(self, store: Store, cluster_secret: bytes) -> None:
        self.store = store
        self.secret = cluster_secret
        self.now = SlurmSettings()

    async def load(self) -> None:
        raw = await self.store.get_setting(SETTING)
        doc = json.loads(raw) if raw else {}
        self.now = SlurmSettings.read(doc if isinstance(doc, dict) else {})

    async def write(self, changed: SlurmSettings, by: Principal, action: str, detail: str) -> None:
        """``changed`` with the next version, written with its audit entry, then taken.
        ``detail`` says what changed in words; it never holds the key."""
        changed = replace(changed, version=self.now.version + 1)
        await self.store.put_setting(SETTING, json.dumps(changed.document(), sort_keys=True))
        await self.store.audit(by.name, action, SETTING, detail)
        self.now = changed

    def with_key(self, settings: SlurmSettings) -> SlurmSettings:
        """The settings with a munge key: the one kept, or a new one at the first setup."""
        if settings.munge_key is not None:
            return settings
        return replace(settings, munge_key=pki.seal(self.secret, os.urandom(MUNGE_KEY_BYTES)))

    def munge_key(self) -> bytes | None:
        sealed = self.now.munge_key
        return pki.unseal(self.secret, sealed) if sealed else None
