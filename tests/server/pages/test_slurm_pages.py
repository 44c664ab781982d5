"""The Slurm page, rendered in process through the pages' own steps (session, role, CSRF,
headers) over a stand-in for the Slurm service that answers as ``GET /api/v1/slurm``
does (``tests/support/slurmjson.py``) and keeps what it was asked: each node's part,
stage, Slurm state, jobs (not read: said so, never 0), version and what it waits for;
the warnings and the problem with their fix; the policy's next step; the files folded
away; lend and reclaim forms for an operator only, each sending the node as the
service's request with the caller, and the service's refusal shown with nothing
changed."""

from __future__ import annotations

import html
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from llmgw.server.access import Gate
from llmgw.server.pages import slurmpages
from llmgw.server.pages.fleetpages import node_rows
from llmgw.server.pages.frame import Frame
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import SlurmNodes
from llmgw.server.sessions import COOKIE, Session, Sessions
from llmgw.wire.admin import SlurmFilesJson, SlurmJson, SlurmNodeJson
from tests.support.pagesfleet import fleet, frame, request
from tests.support.slurmjson import NEXT, slurm_json, slurm_node, slurm_off

SESSIONS = Sessions(b"s" * 32, lambda: ["h"])
SESSION = Session("admin@test", "admin", "sid", time.time() + 60, "b")
NOWHERE = (
    "n1 runs replica qwen-0, which has nowhere else to go: n2: lent to Slurm; n3: 4 GiB "
    "free of 12 GiB needed"
)
FILES: SlurmFilesJson = {
    "slurm_conf": 'ClusterName=llmgw\nNodeName=n1 CPUs=16 State=DRAIN Reason="llmgw: not lent"\n',
    "gres_conf": "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia0\n",
    "cgroup_conf": "",
}


@dataclass
class Desk:
    """The Slurm service as the page calls it: the status it answers, and each change
    asked of it (which node, by whom)."""

    answer: SlurmJson = field(default_factory=slurm_json)
    asked: list[tuple[str, tuple[str, ...], str]] = field(default_factory=list)
    refuse: Refusal | None = None

    def status(self) -> SlurmJson:
        return self.answer

    def files(self) -> SlurmFilesJson:
        return FILES

    def part_of(self, node_id: str) -> str:
        if not self.answer["enabled"]:
            return "none"
        return next((n["part"] for n in self.answer["nodes"] if n["node"] == node_id), "none")

    def node_json(self, node_id: str) -> SlurmNodeJson:
        (found,) = [n for n in self.answer["nodes"] if n["node"] == node_id]
        return found

    async def lend(self, ask: SlurmNodes, by: Principal) -> SlurmJson:
        return self.change("lend", ask, by, "lending")

    async def reclaim(self, ask: SlurmNodes, by: Principal) -> SlurmJson:
        return self.change("reclaim", ask, by, "reclaiming")

    def change(self, what: str, ask: SlurmNodes, by: Principal, stage: str) -> SlurmJson:
        self.asked.append((what, ask.nodes, by.name))
        if self.refuse is not None:
            raise self.refuse
        for n in self.answer["nodes"]:
            if n["node"] in ask.nodes:
                n["stage"] = stage
        return self.answer


@pytest.fixture
def desk() -> Desk:
    return Desk()


@pytest.fixture
async def client(desk: Desk) -> AsyncIterator[httpx.AsyncClient]:
    frame = Frame(Gate(lambda token: False, lambda: None, SESSIONS), lambda: None)
    pages = slurmpages.pages(frame, desk)
    app = Starlette(routes=[Route(p.path, frame.endpoint(p), methods=[p.method]) for p in pages])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as c:
        yield c


def render(template: str, **context: object) -> str:
    return frame().render(request(), template, SESSION, **context).body.decode()


def as_(role: str) -> dict[str, str]:
    return {"cookie": f"{COOKIE}={SESSIONS.open(f'{role}@test', role, 'h')}"}  # type: ignore[arg-type]


def csrf(headers: dict[str, str]) -> str:
    session = SESSIONS.read(headers["cookie"].split("=", 1)[1])
    assert session is not None
    return SESSIONS.csrf(session)


def text(page: str) -> str:
    """The page's words, tags dropped and spaces squeezed."""
    words = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    return re.sub(r" ([,:;)])", r"\1", words)


def row(page: str, node: str) -> str:
    found = re.search(rf'<tr id="slurm-{node}"[^>]*>(.*?)</tr>', page, re.S)
    assert found is not None, node
    return text(found.group(1)).strip()


async def test_without_a_session_the_page_goes_to_sign_in(client: httpx.AsyncClient) -> None:
    answer = await client.get("/admin/slurm")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/admin/login?next=/admin/slurm"


async def test_each_node_its_part_stage_state_jobs_version_and_what_it_waits_for(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/admin/slurm", headers=as_("viewer"))
    assert answer.status_code == 200
    assert "default-src 'none'" in answer.headers["content-security-policy"]
    page = answer.text
    said = text(page)
    assert "Controller n1 10.0.0.1:6817" in said
    assert "Partition llmgw" in said
    assert "slurmctld 6817 · slurmd 6818" in said
    assert row(page, "n1") == "n1 both serving IDLE+DRAIN llmgw: not lent 0 22.05.8 —"
    assert row(page, "n2").startswith("n2 slurmd lent MIXED — 41 train · ayse · RUNNING · ends ")
    assert 'class="stage-lent"' in page
    # slurmctld could not be asked: jobs not read, never 0.
    n3 = row(page, "n3")
    assert n3.startswith("n3 slurmd reclaiming ALLOCATED+DRAIN llmgw: reclaimed not read 22.05.8")
    assert "job 42 to end (srun sleep)" in n3
    assert "munge: munged is not running" in n3
    assert "Fix: restart the agent, which writes the key the control plane sends" in n3
    assert "Drained by a Slurm administrator: llmgw never resumes" in row(page, "n4")
    assert "slurmctld on n1 does not answer Fix: see `journalctl -u slurmctld` on n1" in said
    assert f"Next {NEXT}" in said
    assert "Lend a node idle for 30.0 min" in said
    # The files, folded away (no ``open``), each whole.
    assert '<details class="slurm-files" id="slurm-files">' in page
    assert 'NodeName=n1 CPUs=16 State=DRAIN Reason="llmgw: not lent"' in html.unescape(page)
    assert "Type=h100 File=/dev/nvidia0" in page
    # A viewer sends nothing: no form is drawn.
    assert "/admin/slurm/lend" not in page and "/admin/slurm/reclaim" not in page


async def test_an_operator_gets_the_forms_each_stage_offers(client: httpx.AsyncClient) -> None:
    operator = as_("operator")
    page = (await client.get("/admin/slurm", headers=operator)).text
    assert 'id="lend-n1"' in page and 'id="reclaim-n1"' not in page
    assert 'id="reclaim-n2"' in page and 'id="lend-n2"' not in page
    # Reclaiming: nothing more to send.
    assert 'id="lend-n3"' not in page and 'id="reclaim-n3"' not in page
    # Each form carries the session's CSRF token.
    form = re.search(r'<form[^>]*id="lend-n1">(.*?)</form>', page, re.S)
    assert form is not None
    assert f'name="csrf" value="{csrf(operator)}"' in form.group(1)
    assert 'name="node" value="n1"' in form.group(1)


async def test_lend_sends_the_node_with_the_caller_and_the_page_shows_it(
    client: httpx.AsyncClient, desk: Desk
) -> None:
    operator = as_("operator")
    form = {"node": "n1", "csrf": csrf(operator)}
    answer = await client.post("/admin/slurm/lend", data=form, headers=operator)
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/slurm"
    assert desk.asked == [("lend", ("n1",), "operator@test")]
    page = (await client.get("/admin/slurm", headers=operator)).text
    assert row(page, "n1").startswith("n1 both lending")
    form = {"node": "n2", "csrf": csrf(operator)}
    answer = await client.post("/admin/slurm/reclaim", data=form, headers=operator)
    assert answer.status_code == 303
    assert desk.asked[-1] == ("reclaim", ("n2",), "operator@test")


async def test_a_form_without_the_token_or_from_a_viewer_changes_nothing(
    client: httpx.AsyncClient, desk: Desk
) -> None:
    operator = as_("operator")
    for form in ({"node": "n1"}, {"node": "n1", "csrf": "forged"}):
        answer = await client.post("/admin/slurm/lend", data=form, headers=operator)
        assert answer.status_code == 403
        assert "form token is missing or old" in text(answer.text)
    viewer = as_("viewer")
    answer = await client.post(
        "/admin/slurm/lend", data={"node": "n1", "csrf": csrf(viewer)}, headers=viewer
    )
    assert answer.status_code == 403
    assert "it needs the operator role" in text(answer.text)
    assert desk.asked == []


async def test_the_services_refusal_is_shown_with_its_reason(
    client: httpx.AsyncClient, desk: Desk
) -> None:
    desk.refuse = Refusal(409, "nowhere_to_go", NOWHERE)
    operator = as_("operator")
    answer = await client.post(
        "/admin/slurm/lend", data={"node": "n1", "csrf": csrf(operator)}, headers=operator
    )
    assert answer.status_code == 409
    assert NOWHERE in text(answer.text)
    assert row((await client.get("/admin/slurm", headers=operator)).text, "n1").startswith(
        "n1 both serving"
    )


async def test_a_form_naming_no_node_or_a_bad_one_is_refused_by_name(
    client: httpx.AsyncClient, desk: Desk
) -> None:
    operator = as_("operator")
    for node, said in (("", "node: name a node"), ("n1;rm", "nodes[0]")):
        answer = await client.post(
            "/admin/slurm/reclaim", data={"node": node, "csrf": csrf(operator)}, headers=operator
        )
        assert answer.status_code == 400, node
        assert said in text(answer.text), text(answer.text)
    assert desk.asked == []


async def test_slurm_off_says_how_to_turn_it_on(client: httpx.AsyncClient, desk: Desk) -> None:
    desk.answer = slurm_off()
    said = text((await client.get("/admin/slurm", headers=as_("viewer"))).text)
    assert "Slurm is off: `llmgw ctl slurm setup` turns it on." in said
    assert "Off: `llmgw ctl slurm policy` sets it." in said
    assert "slurm.conf" not in said


async def test_htmx_gets_the_body_alone_and_the_page_speaks_turkish(
    client: httpx.AsyncClient,
) -> None:
    body = await client.get("/admin/slurm", headers={**as_("viewer"), "hx-request": "true"})
    assert body.text.lstrip().startswith('<div id="slurm"')
    assert "<html" not in body.text and "slurm-files" not in body.text
    turkish = {**as_("viewer"), "cookie": as_("viewer")["cookie"] + "; llmgw_lang=tr"}
    said = text((await client.get("/admin/slurm", headers=turkish)).text)
    assert "Denetleyici n1" in said
    assert "Bir Slurm yöneticisi boşalttı" in said
    assert "n2 slurmd Slurm'de MIXED" in said


def test_a_node_page_shows_its_slurm_part_stage_jobs_and_problem() -> None:
    views = fleet(1)
    (row,) = node_rows(views, "", "name")
    desk = Desk()
    lent = slurmpages.node_slurm(desk, "n2")
    page = render("node_body.html", node=row, shards=[], labels_text="", slurm_node=lent)
    part = text(page.split('<article id="node-slurm">')[1].split("</article>")[0])
    assert "Part slurmd" in part and "Stage lent" in part
    assert "Slurm state MIXED" in part and "Jobs 41 train · ayse" in part
    reclaiming = slurmpages.node_slurm(desk, "n3")
    page = render("node_body.html", node=row, shards=[], labels_text="", slurm_node=reclaiming)
    part = text(page.split('<article id="node-slurm">')[1].split("</article>")[0])
    assert "Jobs not read" in part and "Waiting for job 42 to end (srun sleep)" in part
    assert "munge: munged is not running" in part and "Fix: restart the agent" in part
    # Not in Slurm's set, or Slurm off: nothing said of Slurm.
    assert slurmpages.node_slurm(desk, "n9") is None
    assert slurmpages.node_slurm(Desk(slurm_off()), "n2") is None
    page = render("node_body.html", node=row, shards=[], labels_text="", slurm_node=None)
    assert "node-slurm" not in page and "Slurm" not in page


async def test_a_node_that_runs_slurmctld_alone_is_not_offered_to_lend(
    client: httpx.AsyncClient, desk: Desk
) -> None:
    desk.answer["nodes"].append(slurm_node("n5", "slurmctld", "serving"))
    page = (await client.get("/admin/slurm", headers=as_("operator"))).text
    assert row(page, "n5").startswith("n5 slurmctld serving")
    assert 'id="lend-n5"' not in page and 'id="lend-n4"' in page
