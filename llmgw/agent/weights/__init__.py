"""Model weights on the node: sources, the hub client, the cache, fetching and collecting.

``WeightStore.fetch`` gives the supervisor a local path for a source (single flight,
resumed, verified, pickles refused); ``list_cache`` and ``collect`` answer the control
plane's weights requests. Module by responsibility: ``source`` (forms, cache names, the
pickle rule), ``llmgw.modelkit.hub`` (HTTP, and which files of a repository), ``cache``
(layout and markers), ``fetch``, ``inventory``.
"""

from __future__ import annotations

from llmgw.agent.weights.cache import FileRecord, Manifest
from llmgw.agent.weights.errors import (
    ChecksumError,
    DiskSpaceError,
    HubAuthError,
    HubError,
    HubNotFound,
    NetworkError,
    PickleRefused,
    SourceError,
    WeightsError,
)
from llmgw.agent.weights.fetch import DiskUsage, ProgressCallback, WeightStore
from llmgw.agent.weights.inventory import CachedFile, CachedSource, CollectResult, Inventory
from llmgw.modelkit.hub import DEFAULT_ENDPOINT, HubClient, HubFile, Selection, select_files
from llmgw.modelkit.sources import (
    ACCEPTED_FORMS,
    PICKLE_SUFFIXES,
    Source,
    cache_name,
    is_cache_name,
    is_pickled,
    normalise_source,
    parse_source,
)

DEFAULT_CACHE_DIR = "/var/lib/llmgw-weights"

__all__ = [
    "ACCEPTED_FORMS",
    "CachedFile",
    "CachedSource",
    "ChecksumError",
    "CollectResult",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_ENDPOINT",
    "DiskSpaceError",
    "DiskUsage",
    "FileRecord",
    "HubAuthError",
    "HubClient",
    "HubError",
    "HubFile",
    "HubNotFound",
    "Inventory",
    "Manifest",
    "NetworkError",
    "PICKLE_SUFFIXES",
    "PickleRefused",
    "ProgressCallback",
    "Selection",
    "Source",
    "SourceError",
    "WeightStore",
    "WeightsError",
    "cache_name",
    "is_cache_name",
    "is_pickled",
    "normalise_source",
    "parse_source",
    "select_files",
]
