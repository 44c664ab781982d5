"""The states a shard and a node can be in: one name each, shared by every role.

They are ``StrEnum`` members, so on the wire, in the store and in every JSON answer
they are the plain strings they always were ("ready", "Ready"); in code they are
checked names instead of string literals that a typo turns into a silent mismatch.
"""

from __future__ import annotations

from enum import StrEnum


class ShardState(StrEnum):
    """Where a shard stands, as its agent reports it (``ShardStatus.state``)."""

    # The control plane asked for it; its agent has not said a word of it yet.
    PENDING = "pending"
    INSTALLING = "installing"
    DOWNLOADING = "downloading"
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class NodeState(StrEnum):
    """Whether a node's agent is heard from (its heartbeats arrive)."""

    READY = "Ready"
    NOT_READY = "NotReady"
