"""The metric names the packaged monitoring uses: every name in the ``expr`` of the
alerting rules (packaging/prometheus/alerts.yml) and of every panel target of every
Grafana dashboard (packaging/grafana/*.json), so a test can hold them against the names
the control plane exports.

A name is returned exactly as written (``llmgw_request_seconds_bucket``, not the family).
The PromQL reading is deliberately small: string literals, label matchers, range and
subquery brackets, grouping clauses and Grafana variables are cut out first; what is
left that looks like an identifier is a metric name unless it calls a function or is a
keyword.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ALERTS = Path("packaging/prometheus/alerts.yml")
DASHBOARDS = Path("packaging/grafana")

KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "start",
        "end",
        "inf",
        "nan",
    }
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_BRACKETS = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
# Not after a word character or '.', so the 'h' of '1h' and the 'e3' of '1e3' are no names.
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")


def expr_metric_names(expr: str) -> set[str]:
    """The metric names one PromQL expression selects."""
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.groups()
        if not call and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def _panel_exprs(node: Any) -> Iterator[str]:
    """Every target ``expr`` under a dashboard (panels nested in rows included)."""
    if isinstance(node, dict):
        for target in node.get("targets") or []:
            if isinstance(target, dict) and isinstance(target.get("expr"), str):
                yield target["expr"]
        for key in ("panels", "rows"):
            yield from _panel_exprs(node.get(key))
    elif isinstance(node, list):
        for item in node:
            yield from _panel_exprs(item)


def packaged_exprs(root: Path) -> list[str]:
    """The PromQL of the alerting rules and of every dashboard panel under ``root``."""
    rules = yaml.safe_load((root / ALERTS).read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    for path in sorted((root / DASHBOARDS).glob("*.json")):
        exprs.extend(_panel_exprs(json.loads(path.read_text())))
    return exprs


def packaged_metric_names(root: Path) -> set[str]:
    """Every metric name the alerts and dashboards under ``root`` (the repository) use."""
    return {name for expr in packaged_exprs(root) for name in expr_metric_names(expr)}
