"""The guard page of a real control plane, called in process over its SQLite store
through the pages' own steps (session, role, CSRF, headers) and the real
``GuardService``."""

from __future__ import annotations

import time

from llmgw.server.guard.reading import Decision
from tests.server.pages.inprocess import Site, row, text


async def test_the_guard_page_lists_policies_and_recent_decisions(site: Site) -> None:
    assert 'id="no-policies"' in await site.page("/admin/guard", "operator")
    operator = await site.post("/admin/guard/policies", "operator", name="pii")
    assert operator.status_code == 403
    answer = await site.post(
        "/admin/guard/policies", "admin", name="pii", pii="block", injection="flag", wait_ms="500"
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/guard#policy-pii"
    bad = await site.post("/admin/guard/policies", "admin", name="j", judge="no-such-model")
    assert bad.status_code == 400 and "no model named no-such-model" in bad.text
    # Nothing counted yet: a dash, not a row of zeros.
    assert row(await site.page("/admin/guard", "operator"), "policy-pii").endswith("refuse —")
    site.cp.guard.record(
        Decision(time.time(), "pii", "block", "ci", "tool_args tickets.create", "email at 3-20")
    )
    page = await site.page("/admin/guard", "operator")
    assert row(page, "policy-pii") == "pii pattern rules only flag block 500 ms refuse block 1"
    said = text(page)
    assert "pii block ci tool_args tickets.create email at 3-20" in said
    # An operator reads; only an admin gets the forms.
    assert 'id="guard-add"' not in page and 'id="remove-pii"' not in page
    admin = await site.page("/admin/guard?policy=pii")
    assert 'id="guard-add"' in admin
    assert 'id="no-decisions"' in await site.page("/admin/guard?policy=other")
    answer = await site.post("/admin/guard/policies/pii/remove", "admin")
    assert answer.status_code == 303
    assert 'id="no-policies"' in await site.page("/admin/guard")
    # The decision's audit entry is queued on the trail, written with its second's others.
    await site.cp.audit_trail.flush()
    assert any(e["action"] == "guard.block" for e in await site.cp.store.audit_log(50))


async def test_the_guard_page_speaks_turkish(site: Site) -> None:
    headers = {**site.as_("operator"), "accept-language": "tr-TR,tr;q=0.9"}
    guard = (await site.client.get("/admin/guard", headers=headers)).text
    assert "Son kararlar" in guard and "Henüz koruma politikası yok" in guard
