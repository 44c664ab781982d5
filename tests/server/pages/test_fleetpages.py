"""The fleet pages' figures and tables over a recorded-looking fleet of 1,000 nodes,
rendered by the real templates without a server (``tests/support/pagesfleet.py``;
``bench/pages.py`` times the same)."""

from __future__ import annotations

import re
import time
from dataclasses import replace

from llmgw.server.pages import i18n
from llmgw.server.pages.fleetpages import gpu_map, node_rows, overview_figures
from llmgw.server.sessions import Session
from tests.support.pagesfleet import fleet, frame, request

SESSION = Session("admin@test", "admin", "sid", time.time() + 60, "b")


def render(template: str, **context: object) -> str:
    return frame().render(request(), template, SESSION, **context).body.decode()


def test_a_thousand_nodes_render_every_row_and_leave_unread_figures_absent() -> None:
    views = fleet(1000)
    rows = node_rows(views, "", "name")
    page = render("nodes_table.html", rows=rows, q="", sort="name", total=len(views))
    assert page.count('<tr>\n  <td><a href="/admin/nodes/gpu') == 1000
    assert "1000 of 1000 nodes" in page
    # Node 5 (of 97) has cards whose figures were not read: no bar, no zero for them.
    five = gpu_map([views[5]], "busy")[0]["cards"]
    assert all(c["value"] is None and c["bucket"] is None for c in five)


def test_the_filter_takes_names_states_labels_and_cards_and_the_sort_puts_unread_last() -> None:
    views = fleet(100)
    assert [r.id for r in node_rows(views, "gpu00042", "name")] == ["gpu00042"]
    assert {r.id for r in node_rows(views, "notready", "name")} == {"gpu00007", "gpu00057"}
    assert len(node_rows(views, "rack=r1 h100", "name")) == 36  # 40 in rack 1, 4 CPU-only
    views[0].live.cpu_percent = None
    by_cpu = node_rows(views, "", "cpu")
    shares = [r.cpu_share for r in by_cpu]
    assert shares[-1] is None and shares[:-1] == sorted(shares[:-1], reverse=True)


def test_the_gpu_map_buckets_each_figure_and_says_which_in_its_legend() -> None:
    views = fleet(20)
    facts = views[0].facts
    assert facts is not None
    card = replace(
        facts.gpus[0], utilization=100, sm_active=0.25, temperature=90, memory_used=0, power=350.0
    )
    views[0].facts = replace(facts, gpus=[card, *facts.gpus[1:]])
    cells = {
        by: gpu_map(views[:1], by)[0]["cards"][0]["bucket"]
        for by in ("work", "busy", "memory", "temperature", "power")
    }
    assert cells == {"work": 2, "busy": 9, "memory": 0, "temperature": 9, "power": 5}
    groups = gpu_map(views, "work")
    assert len(groups) == 18 and all(len(g["cards"]) == 8 for g in groups)  # 2 CPU-only
    page = render("gpus_body.html", groups=groups, by="busy", figures={})
    assert len(re.findall(r'class="cell (?:b\d|none)" title=', page)) == 18 * 8
    assert "utilization.gpu" in page  # the legend says what busy is


def test_the_overview_counts_states_cards_and_lists_each_warning_with_its_fix() -> None:
    class Registry:
        nodes = {v.id: v for v in fleet(100)}

    figures = overview_figures(Registry())  # type: ignore[arg-type]
    states = dict(figures["states"])
    assert states["Ready"] == 98 and states["NotReady"] == 2 and states["cordoned"] == 3
    (h100,) = figures["cards"]
    assert h100["model"] == "NVIDIA H100 80GB HBM3" and h100["count"] == 720
    assert 0 < h100["busy"] < 1 and 0 < h100["memory"] < 1
    node, what, fix = figures["alerts"][0]
    assert node == "gpu00000" and what.startswith("pcie: card 3") and fix == "reseat card 3 on gpu0"


def test_a_browser_asking_for_turkish_gets_the_table_in_turkish() -> None:
    views = fleet(3)
    rows = node_rows(views, "", "name")
    lang = request()
    lang.scope["headers"] = [(b"accept-language", b"tr")]
    answer = frame().render(
        lang, "nodes_table.html", SESSION, rows=rows, q="", sort="name", total=3
    )
    page = answer.body.decode()
    _ = i18n.translator("tr")
    assert _("{n} of {total} nodes", n=3, total=3) in page and _("Node") in page
    assert "3 of 3 nodes" not in page


def test_a_nodes_page_shows_its_cards_with_figures_not_read_said_so() -> None:
    """Its cards were wire maps without the fields not read, which the page's strict
    templates could not read (``g.mig_class``): a node page with cards failed to render."""
    views = fleet(10)
    for i, unread in ((0, False), (5, True)):
        (row,) = node_rows(views[i : i + 1], "", "name")
        page = render("node_body.html", node=row, shards=[], labels_text="", slurm_node=None)
        cards = re.findall(r"<td>(\d) <code>(GPU-[0-9a-f-]+)</code></td>", page)
        assert cards == [(str(g.index), g.uuid) for g in row.gpus] and len(cards) == 8
        assert ("not read" in page.split("<h2>Cards</h2>")[1]) is unread


def test_figures_not_live_are_shown_grey_with_their_age_and_left_off_the_map() -> None:
    """A node whose nvidia-smi hangs: its cards' last figures, 40 s old, are greyed on
    its page with their age; the GPU map and the overview's means leave them out; its
    CPU and memory, read with the heartbeat, stay live."""
    views = fleet(10)
    view = views[1]
    now = time.time()
    view.live.read_at["gpus"] = now - 40
    (row,) = node_rows([view], "", "name")
    assert row.stale == {"gpus": 40}
    page = render("node_body.html", node=row, shards=[], labels_text="", slurm_node=None)
    cards = page.split("<h2>Cards</h2>")[1].split("</article>")[0]
    assert "read 40 s ago" in cards and '<table class="stale">' in cards
    assert "°C" in cards  # the last figures, shown for what they are
    host = page.split("<h2>Cards</h2>")[0]
    assert "s ago" not in host and 'class="stale"' not in host
    assert all(c["value"] is None for c in gpu_map([view], "temperature")[0]["cards"])
    assert all(c["value"] is not None for c in gpu_map([views[0]], "temperature")[0]["cards"])

    view.live.unread = frozenset({"gpus"})
    view.live.read_at["gpus"] = now - 3  # read lately, but the agent says it cannot now
    (row,) = node_rows([view], "", "name")
    assert row.stale == {"gpus": 3}

    # After a control plane restart nothing has an age until the agent is back.
    view.live.read_at.clear()
    (row,) = node_rows([view], "", "name")
    assert set(row.stale) == {"gpus", "cpu_percent", "memory_available", "disks"}
    page = render("node_body.html", node=row, shards=[], labels_text="", slurm_node=None)
    assert page.count("read at an unknown time") == 4
