"""What can go wrong getting a model's weights onto a node, one exception a reason.

Every message names the thing at fault (the source, the file, the host) and, where
there is one, the fix, because it travels unchanged to ``ctl replicas`` and the
shard's status: the operator reads it there, far from the node.
"""

from __future__ import annotations

from llmgw.modelkit.hub import HubAuthError, HubError, HubNotFound, NetworkError
from llmgw.modelkit.sources import PickleRefused, SourceError, WeightsError

__all__ = [
    "HubAuthError",
    "HubError",
    "HubNotFound",
    "NetworkError",
    "PickleRefused",
    "SourceError",
    "WeightsError",
]


class ChecksumError(WeightsError):
    """A downloaded file's sha256 or size is not what the hub published."""


class DiskSpaceError(WeightsError):
    """The cache's filesystem cannot hold what is still to be fetched."""
