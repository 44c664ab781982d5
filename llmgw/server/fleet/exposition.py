"""The fleet on ``/metrics``: every node's, card's and engine's figures as Prometheus text.

Written from the registry's latest reports when scraped, named as docs/telemetry.md
lists them (base units, ``_total`` counters). A figure the agent did not report is left
out, never written as 0, and a node not heard from for ``STALE`` seconds has only its
``llmgw_node_up`` written: its figures are too old to stand for now.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from llmgw import metricstext
from llmgw.server.fleet.figures import NodeFigures, node_warnings
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import GpuHealth, IbPort, NodeVitals
from llmgw.wire.messages import ShardUsage
from llmgw.wire.states import NodeState
from llmgw.wire.warnings import warning_kind

STALE = 60.0


_esc = metricstext.esc


def label_text(pairs: Mapping[str, object]) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in pairs.items())


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


_fmt = metricstext.fmt


class Families:
    """Samples grouped by family, written with one HELP and TYPE each, in first-use order."""

    def __init__(self) -> None:
        self._meta: dict[str, tuple[str, str]] = {}
        self._samples: dict[str, list[str]] = {}

    def declare(self, name: str, kind: str, text: str) -> None:
        self._meta.setdefault(name, (kind, text))
        self._samples.setdefault(name, [])

    def add(self, name: str, labels: str, value: float | None, scale: float = 1.0) -> None:
        self.add_each(labels, ((name, value, scale),))

    def add_each(self, labels: str, samples: Iterable[tuple[str, float | None, float]]) -> None:
        """Samples of one label set: (family, value, scale) each, None values left out.

        The hot path of a scrape (about 50 samples a card): an exact int or float is
        written as it is; a bool (an int to Python) is no figure."""
        out = self._samples
        for name, value, scale in samples:
            if type(value) is int:
                text = str(value) if scale == 1.0 else _fmt(value * scale)
            elif type(value) is float:
                text = _fmt(value if scale == 1.0 else value * scale)
            else:
                continue
            out[name].append(f"{name}{{{labels}}} {text}")

    def lines(self) -> Iterable[str]:
        for name, (kind, text) in self._meta.items():
            yield f"# HELP {name} {text}"
            yield f"# TYPE {name} {kind}"
            yield from self._samples[name]


@dataclass(frozen=True)
class NodeSnapshot:
    """What /metrics writes of one node, taken on the event loop so the text can be
    written in a worker thread while heartbeats go on changing the registry (they
    replace a view's records, never change one)."""

    id: str
    up: bool
    last_seen: float | None
    figures: NodeFigures  # the facts with the latest live figures over them
    cuda_version: str | None
    # Discovery's warnings, then the cards' health warnings.
    warnings: tuple[str, ...]
    gpu_health: tuple[GpuHealth, ...]
    vitals: NodeVitals | None
    ib_ports: tuple[IbPort, ...]
    usage: dict[str, ShardUsage]
    sources: dict[str, str | None]  # replica -> what it serves

    @classmethod
    def of(cls, view: NodeView, now: float | None = None) -> NodeSnapshot:
        """The node as of ``now`` (wall clock): a figure that is not live (too old, or
        unread lately by its agent) is left out, a card keeping what it is."""
        facts, live = view.facts, view.live
        now = time.time() if now is None else now
        return cls(
            id=view.id,
            up=view.state == NodeState.READY,
            last_seen=view.last_seen,
            figures=NodeFigures.shown(facts, live, now),
            cuda_version=facts.cuda_version if facts else None,
            warnings=tuple(node_warnings(facts, live)),
            gpu_health=tuple(live.gpu_health or ()) if live.is_live("gpu_health", now) else (),
            vitals=live.vitals if live.is_live("vitals", now) else None,
            ib_ports=tuple(live.ib_ports or ()) if live.is_live("ib_ports", now) else (),
            usage=dict(view.usage),
            sources={r: s.source for r, s in view.shards.items()},
        )


def _shards(view: NodeSnapshot) -> tuple[metricstext.ShardUsage, ...]:
    out = []
    for replica, usage in sorted(view.usage.items()):
        cpu = _num(usage.cpu_percent)
        out.append(
            metricstext.ShardUsage(
                replica,
                view.sources.get(replica) or "",
                None if cpu is None else cpu / 100,
                usage.rss,
            )
        )
    return tuple(out)


def sample(
    view: NodeSnapshot, shards: tuple[metricstext.ShardUsage, ...] | None = None
) -> metricstext.NodeSample:
    """The snapshot as the kernel's writer takes it (``llmgw.metricstext``)."""
    figures = view.figures
    return metricstext.NodeSample(
        id=view.id,
        up=view.up,
        cpu_count=figures.cpu_count,
        memory_total=figures.memory_total,
        memory_available=figures.memory_available,
        cpu_percent=figures.cpu_percent,
        load=figures.load,
        gpus=figures.gpus,
        disks=figures.disks,
        cuda_version=view.cuda_version,
        warnings=view.warnings,
        gpu_health=view.gpu_health,
        vitals=view.vitals,
        ib_ports=view.ib_ports,
        shards=_shards(view) if shards is None else shards,
    )


def _key(
    view: NodeSnapshot, stale: bool, shards: tuple[metricstext.ShardUsage, ...]
) -> tuple[object, ...]:
    """What a node's text is made of. The records (cards, health, ports, disks, vitals)
    are compared by identity: a heartbeat replaces them, never changes one in place
    (``figures.LiveFigures``), so the same objects are the same figures."""
    f = view.figures
    return (
        view.up,
        stale,
        f.cpu_count,
        f.memory_total,
        f.memory_available,
        f.cpu_percent,
        f.load,
        view.cuda_version,
        view.warnings,
        shards,
        view.vitals,
        *f.gpus,
        None,
        *(f.disks or ()),
        None,
        *view.gpu_health,
        None,
        *view.ib_ports,
    )


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    if len(a) != len(b):
        return False
    # The leading figures are plain values; the records after them are compared by
    # identity (never by their fields: that would cost as much as writing them).
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x is y:
            continue
        if i >= _PLAIN_KEYS or x != y:
            return False
    return True


_PLAIN_KEYS = 10  # vitals and the records after it: by identity


def _steady_key(view: NodeSnapshot) -> tuple[object, ...]:
    """What a node's steady text (``metricstext.steady_text``) is made of: its cards'
    steady facts, compared by value (each heartbeat's cards are new objects with the
    same facts), and their health records, by identity (read a minute apart)."""
    return (
        view.cuda_version,
        *map(metricstext.steady_key, view.figures.gpus),
        None,
        *view.gpu_health,
    )


@dataclass(frozen=True)
class _Kept:
    key: tuple[object, ...]
    moving: metricstext.NodeText
    steady_key: tuple[object, ...] | None  # None: a stale node, its ``up`` alone
    steady: metricstext.NodeText
    text: metricstext.NodeText


class NodeTexts:
    """Each node's text kept from the last scrape, its two parts written again only
    when what they are made of changed: the moving part (``written`` counts the nodes
    it was written for) when a heartbeat replaced the node's records, the steady part
    (``steady_written``) when a card's facts changed or its health was read again.

    Scrapes run in a worker thread, so one at a time holds the lock."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()
        self.written = 0
        self.steady_written = 0

    def clear(self) -> None:
        """Forget every node's text: what fleet detail turned off no longer needs (at
        5,000 nodes of 8 cards the texts are about 290 MB)."""
        with self._lock:
            self._kept = {}

    def text(
        self,
        nodes: Iterable[NodeSnapshot],
        kind_of: Callable[[str], str] = warning_kind,
        now: float | None = None,
    ) -> str:
        """Every node's samples as one exposition (HELP and TYPE once a family)."""
        return "".join(self.parts(nodes, kind_of, now))

    def parts(
        self,
        nodes: Iterable[NodeSnapshot],
        kind_of: Callable[[str], str] = warning_kind,
        now: float | None = None,
    ) -> list[str]:
        """``text``'s pieces in order, not joined (``metricstext.parts``)."""
        now = time.time() if now is None else now
        with self._lock:
            kept, fresh = self._kept, {}
            texts = []
            for view in sorted(nodes, key=lambda v: v.id):
                found = self._node(view, kept.get(view.id), kind_of, now)
                fresh[view.id] = found
                texts.append(found.text)
            # Nodes gone since are forgotten with their records.
            self._kept = fresh
            return metricstext.parts(texts)

    def _node(
        self,
        view: NodeSnapshot,
        old: _Kept | None,
        kind_of: Callable[[str], str],
        now: float,
    ) -> _Kept:
        stale = view.last_seen is None or now - view.last_seen > STALE
        shards = _shards(view)
        key = _key(view, stale, shards)
        if old is not None and _same(old.key, key):
            return old
        self.written += 1
        if stale:
            up = metricstext.up_text(view.id, view.up)
            return _Kept(key, up, None, up, up)
        figures = sample(view, shards)
        moving = metricstext.moving_text(figures, kind_of)
        steady_key = _steady_key(view)
        if old is not None and old.steady_key == steady_key:
            steady = old.steady
        else:
            self.steady_written += 1
            steady = metricstext.steady_text(figures)
        return _Kept(key, moving, steady_key, steady, metricstext.merged(moving, steady))


def up_metrics(nodes: Iterable[tuple[str, bool]]) -> str:
    """Only ``llmgw_node_up`` of each (node, Ready): the fleet without its detail."""
    name, kind, text = metricstext.FAMILIES[0]
    lines = [f"# HELP {name} {text}\n# TYPE {name} {kind}\n"]
    lines += [f'{name}{{node="{_esc(node)}"}} {int(up)}\n' for node, up in sorted(nodes)]
    return "".join(lines)


def fleet_metrics(
    nodes: Iterable[NodeView | NodeSnapshot],
    kind_of: Callable[[str], str] = warning_kind,
    now: float | None = None,
) -> list[str]:
    """Prometheus text lines for every node; ``kind_of`` names a warning's kind. Give
    snapshots (``NodeSnapshot.of``) to write them away from the event loop."""
    now = time.time() if now is None else now
    snaps = [n if isinstance(n, NodeSnapshot) else NodeSnapshot.of(n, now) for n in nodes]
    return NodeTexts().text(snaps, kind_of, now).splitlines()


def cluster_metrics(
    models: Iterable[tuple[str, int, int]],
    budgets: Iterable[tuple[str, str, int, int]],
    joules_per_token: Mapping[tuple[str, str], float],
) -> list[str]:
    """Models' replicas wanted and Ready (name, desired, ready), each key's share of its
    monthly budget used (id, name, tokens used, budget), and each replica's card energy
    per answered token by (model, replica)."""
    f = Families()
    f.declare(
        "llmgw_replica_joules_per_token",
        "gauge",
        "A replica's card energy over the tokens it answered, since this control plane started.",
    )
    for (model, replica), value in sorted(joules_per_token.items()):
        f.add(
            "llmgw_replica_joules_per_token",
            label_text({"model": model, "replica": replica}),
            value,
        )
    f.declare("llmgw_model_replicas_wanted", "gauge", "Replicas a model should have now.")
    f.declare("llmgw_model_replicas_ready", "gauge", "Replicas of a model Ready.")
    f.declare("llmgw_key_budget_used_ratio", "gauge", "A key's tokens this month over its budget.")
    for name, desired, ready in sorted(models):
        where = f'model="{_esc(name)}"'
        f.add("llmgw_model_replicas_wanted", where, desired)
        f.add("llmgw_model_replicas_ready", where, ready)
    for key_id, name, used, budget in sorted(budgets):
        if budget > 0:
            where = label_text({"key": key_id, "name": name})
            f.add("llmgw_key_budget_used_ratio", where, used / budget)
    return list(f.lines())
