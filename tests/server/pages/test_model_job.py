"""A model's page shows its newest serve job: each step with its state and detail, the
nodes' downloads, and why it failed, in the language asked for."""

from __future__ import annotations

from llmgw.server.pages import i18n
from tests.server.catalog.test_jobs import node
from tests.server.pages.inprocess import Site, text

GIB = 1024**3


async def test_a_model_page_shows_its_serve_job_as_it_goes(site: Site) -> None:
    site.cp.registry.nodes["a"] = node("a")
    body = {"source": "/models/m.gguf", "name": "m", "memory": GIB, "context": 512}
    made = await site.api("POST", "/api/v1/models", body)
    assert isinstance(made, dict)
    job = made["job"]
    shown = text(await site.page("/admin/models/m"))
    assert f"Serve job {job}: running" in shown
    assert "resolve done /models/m.gguf, engine llama.cpp" in shown
    assert "place running" in shown and "ready pending" in shown
    assert f"llmgw ctl jobs --follow {job}" in shown

    following = site.cp.models.jobs.running[job]
    following.job.fail("fetch", "HTTP 404 from the hub", following.job.updated)
    shown = text(await site.page("/admin/models/m"))
    assert f"Serve job {job}: failed" in shown
    assert "Failed at fetch: HTTP 404 from the hub" in shown
    assert "fetch failed" in shown and "--follow" not in shown


def test_the_job_section_s_words_are_in_turkish() -> None:
    said = i18n.translator("tr")("Failed at {step}: {reason}", step="fetch", reason="x")
    assert said == "fetch adımında başarısız oldu: x"
