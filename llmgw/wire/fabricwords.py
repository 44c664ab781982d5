"""How the parts of a fabric's map (``GET /api/v1/fabrics/{id}/topology``) are named
for a person, the same in the console and the pages: a switch by its description's
name, a cable's end by its host and adapter or its switch and port, names in natural
order (leaf-2 before leaf-10)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


def switch_name(node: dict[str, Any]) -> str:
    """``MF0;leaf-1:MQM8700/U1`` -> ``leaf-1``; the GUID when there is no description."""
    description = str(node.get("description") or "")
    name = description.partition(";")[2] or description
    return name.partition(":")[0] or str(node.get("guid"))


def natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts leaf-2 before leaf-10."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


def end_name(nodes: dict[str, dict[str, Any]], end: Sequence[Any]) -> str:
    """One end of a cable: ``gpu-05 mlx5_1``, ``leaf-2 port 17``, or the GUID's port."""
    node = nodes.get(str(end[0]))
    if node is None:
        return f"{end[0]} port {end[1]}"
    if node.get("kind") == "switch":
        return f"{switch_name(node)} port {end[1]}"
    if node.get("host"):
        return f"{node['host']} {node.get('adapter') or ''}".rstrip()
    return f"{node.get('description') or node.get('guid')} port {end[1]}"
