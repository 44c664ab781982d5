"""The OpenAI-compatible gateway (``/v1``): checks, keys and limits, routing, proxying,
metrics, images in chat requests, and the probe of engines whose agent is silent."""

from llmgw.server.gateway.keyservice import STOPPED_SETTING, KeyService, ServingSwitch
from llmgw.server.gateway.limits import KEY_PREFIX, key_hash, new_key
from llmgw.server.gateway.router import Endpoint
from llmgw.server.gateway.service import Gateway

__all__ = [
    "KEY_PREFIX",
    "STOPPED_SETTING",
    "Endpoint",
    "Gateway",
    "KeyService",
    "ServingSwitch",
    "key_hash",
    "new_key",
]
