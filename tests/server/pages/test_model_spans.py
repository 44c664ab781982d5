"""A model's page for a profile whose replicas span nodes: `explain`'s sets of nodes,
best first, with the nodes each would take or why it cannot."""

from __future__ import annotations

from typing import Any

from llmgw.server.access import Gate
from llmgw.server.pages import i18n
from llmgw.server.pages.frame import Frame
from llmgw.server.sessions import Sessions
from tests.server.pages.test_fabric_pages import text


def page(explained: list[dict[str, Any]], lang: str = "en") -> str:
    frame = Frame(Gate(lambda token: False, lambda: None, Sessions(b"f" * 32, lambda: ["h"])), dict)
    model = {
        "name": "big",
        "state": "serving",
        "source": "hf:org/big",
        "engine": "vllm",
        "context": 4096,
        "max_output": None,
        "replicas": 1,
        "ready": 1,
        "desired": 1,
        "external": None,
        "profiles": [],
    }
    return frame.env.get_template("model_body.html").render(
        _=i18n.translator(lang), model=model, explained=explained, csrf="", lang=lang, now=0.0
    )


SPANS = [
    {
        "kind": "fabric",
        "id": "0xa",
        "ok": True,
        "fitting": ["a1", "a2", "a3"],
        "needed": 2,
        "chosen": ["a1", "a2"],
        "leaf_sets": 1,
        "notes": ["all under the same leaf switches"],
        "reason": "",
    },
    {
        "kind": "fabric",
        "id": "0xb",
        "ok": False,
        "fitting": ["b1"],
        "needed": 2,
        "chosen": [],
        "leaf_sets": None,
        "notes": [],
        "reason": "1 node(s) fit, 2 needed",
    },
]


def test_the_sets_of_nodes_are_shown_best_first_with_why() -> None:
    explained = [{"profile": "default", "nodes": 2, "spans": SPANS, "verdicts": []}]
    shown = text(page(explained))
    assert "One replica spans this many nodes: 2" in shown
    first, second = shown.index("fabric 0xa"), shown.index("fabric 0xb")
    assert first < second
    assert "a1, a2" in shown and "all under the same leaf switches" in shown
    assert "1 node(s) fit, 2 needed" in shown
    assert "Düğüm kümeleri, en iyisi önce" in text(page(explained, "tr"))


def test_a_one_node_profile_shows_no_sets() -> None:
    explained = [{"profile": "default", "nodes": 1, "spans": None, "verdicts": []}]
    assert "Sets of nodes" not in text(page(explained))
