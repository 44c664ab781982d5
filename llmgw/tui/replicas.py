"""Replicas: every shard the nodes run, with its state, node, cards, compute and
download progress."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import DataTable

from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, fill
from llmgw.wire.admin import ReplicaJson, ShardJson

COLUMNS = ("REPLICA", "MODEL", "NODE", "STATE", "CARDS", "PORT", "PID", "COMPUTE", "PROGRESS")


def compute(r: ShardJson) -> str:
    text = r.get("backend") or DASH
    if r.get("offloaded_layers") is not None:
        text += f" {r['offloaded_layers']}/{r.get('total_layers')} layers"
    return text


def progress(r: ReplicaJson) -> str:
    d = r.get("download")
    if not d:
        return r.get("note") or ""
    done, total = d.get("done") or 0, d.get("total")
    if total:
        return f"downloading {done / total * 100:.0f}% of {total / 1e9:.1f} GB"
    return f"downloading {done / 1e6:.1f} MB so far"


class ReplicasPane(Pane):
    TITLE = "Replicas"
    ID = "replicas"
    KEY = "4"

    def compose(self) -> ComposeResult:
        yield DataTable(id="replicas-table", cursor_type="row", zebra_stripes=True)

    def update_from(self, snapshot: Snapshot) -> None:
        rows = {
            r["replica_id"]: (
                r["replica_id"],
                r.get("model") or DASH,
                r["node"],
                r.get("state") or DASH,
                ",".join(c[:12] for c in r.get("cards") or []) or DASH,
                str(r.get("port") or DASH),
                str(r.get("pid") or DASH),
                compute(r),
                progress(r),
            )
            for r in snapshot.replicas
        }
        fill(self.query_one(DataTable), COLUMNS, rows)
