"""An organisation's admin at work on ``/admin/org`` in a real browser, against a real
control plane: they add a person to a team and make a key for one of the team's
projects, and the admin API then has both.

The person's session is opened with the cluster's own key (``Sessions.open_person``), as
the sign-in through the cluster's identity provider opens it: what is under test is the
page, not the sign-in.
"""

from __future__ import annotations

from playwright.sync_api import Browser, expect

from llmgw.server.datadir import DataDir
from llmgw.server.sessions import COOKIE, Sessions
from tests.e2e.cluster import Cluster
from tests.e2e.pages import watch_console


def test_an_org_admin_adds_a_team_member_and_makes_a_project_key(
    cluster: Cluster, pages_browser: Browser
) -> None:
    alice = cluster.api("/api/v1/people", body={"login": "alice"})
    dave = cluster.api("/api/v1/people", body={"login": "dave", "name": "Dave"})
    org = cluster.api("/api/v1/orgs", body={"name": "acme"})
    team = cluster.api(f"/api/v1/orgs/{org['id']}/teams", body={"name": "ml"})
    project = cluster.api(f"/api/v1/orgs/{org['id']}/projects", body={"name": "chat", "team": "ml"})
    cluster.api(f"/api/v1/orgs/{org['id']}/members", body={"person": "alice", "role": "admin"})
    secret = DataDir(cluster.data_dir).cluster_secret()
    cookie = Sessions(secret, list).open_person("alice", alice["id"])
    base = f"http://{cluster.listen}"
    host = cluster.listen.rsplit(":", 1)[0]

    context = pages_browser.new_context(viewport={"width": 1440, "height": 900})
    context.add_cookies([{"name": COOKIE, "value": cookie, "domain": host, "path": "/admin"}])
    page = context.new_page()
    errors = watch_console(page)
    page.goto(f"{base}/admin/org")
    # A person with no cluster role: the header offers only what they may open.
    expect(page.locator("nav")).to_contain_text("Organisations")
    expect(page.locator("nav")).not_to_contain_text("Nodes")
    page.click("ul.orgs >> text=acme")
    expect(page.locator("h1")).to_have_text("acme")

    form = page.locator("#set-member")
    form.locator("input[name=person]").fill("dave")
    form.locator("select[name=team]").select_option(label="ml")
    form.locator("select[name=role]").select_option("member")
    form.locator("button[type=submit]").click()
    row = page.locator("table.members tr", has_text="dave")
    expect(row).to_contain_text("team ml")

    keys = page.locator("#new-key-form")
    keys.locator("input[name=name]").fill("chatbot")
    keys.locator("select[name=owner]").select_option(f"project:{project['id']}")
    keys.locator("input[name=models]").fill("tiny")
    keys.locator("button[type=submit]").click()
    key = page.locator("#new-key").inner_text().strip()
    assert key.startswith("sk-llmgw-")
    expect(page.locator("table.keys tr", has_text="chatbot")).to_contain_text("acme / ml/chat")
    # Shown once: the page opened again has the key's name, never the key.
    page.goto(f"{base}/admin/org/{org['id']}")
    expect(page.locator("table.keys")).to_contain_text("chatbot")
    assert key not in page.content()
    assert errors == [], f"the page logged errors (a CSP refusal?): {errors}"
    context.close()

    members = cluster.api(f"/api/v1/orgs/{org['id']}/members")
    assert {
        (m["login"], m["kind"], m["scope_id"], m["role"]) for m in members if m["login"] == "dave"
    } == {("dave", "team", team["id"], "member")}
    (made,) = [k for k in cluster.api("/api/v1/keys") if k["name"] == "chatbot"]
    assert (made["org_id"], made["project_id"], made["person_id"]) == (
        org["id"],
        project["id"],
        None,
    )
    assert made["models"] == ["tiny"]
    assert dave["name"] == "Dave"
