"""The fine-tune service in process: refusals before anything is sent, the node it
picks, the node's word, a lost node, cancel, and the adapter taken back in pieces."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmgw.server.finetune.service import PIECE, FinetuneAsk, FinetuneService
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.wire.codec import from_map
from llmgw.wire.messages import FinetuneSpec, FinetuneStatus
from tests.server.finetune.conftest import Plane
from tests.support.finetunes import AgentEnd, card, sha

ADMIN = Principal("admin@test", "admin", "admin_token")
PAIRS = "".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(20))


def ask(**kw: object) -> FinetuneAsk:
    fields: dict[str, object] = {"model": "m", "name": "tuned", "data": PAIRS, "mib": 4000}
    fields.update(kw)
    return FinetuneAsk(**fields)  # type: ignore[arg-type]


async def refused(plane: Plane, **kw: object) -> Refusal:
    with pytest.raises(Refusal) as caught:
        await plane.service.create(ask(**kw), ADMIN)
    for end in plane.ends.values():
        assert end.asks == []  # nothing was sent
    assert plane.service.jobs == {} and await plane.store.finetunes.list() == []
    return caught.value


async def test_refused_before_anything_is_sent(plane: Plane) -> None:
    plane.node("n1")
    bad = await refused(plane, data=PAIRS + '{"prompt": "x"}\n')
    assert "line 21: 'completion' is missing" in bad.message
    assert (await refused(plane, model="nope")).status == 404
    gguf = await refused(plane, model="g")
    assert "--base" in gguf.message and "served from GGUF" in gguf.message
    assert "no node can train with 999,999 MiB" in (await refused(plane, mib=999_999)).message


async def test_the_name_must_be_free(plane: Plane) -> None:
    plane.node("n1")
    taken = await refused(plane, name="m")
    assert taken.status == 409 and "model's name" in taken.message
    await plane.service.create(ask(), ADMIN)
    plane.node("n2")
    with pytest.raises(Refusal) as caught:
        await plane.service.create(ask(), ADMIN)
    assert "already makes or made the adapter 'tuned'" in caught.value.message


async def test_sent_in_pieces_to_the_node_with_the_card(plane: Plane) -> None:
    cpu = plane.node("cpu1", ram=500 * 1024**3)
    gpu = plane.node("gpu1", gpus=[card("GPU-a", 2), card("GPU-b", 40)])
    big = "".join(  # 2.5 MB: three pieces
        json.dumps({"prompt": f"q{i}", "completion": "x" * 100_000}) + "\n" for i in range(25)
    )
    job = await plane.service.create(ask(data=big, base="hf:org/base-model"), ADMIN)
    assert job.id.startswith("ft-") and len(job.id) == 15
    assert (job.node, job.device, job.cards, job.state) == ("gpu1", "cuda", ("GPU-b",), "preparing")
    assert cpu.asks == []
    assert gpu.kinds() == ["finetune.data"] * 3 + ["finetune.start"]
    assert bytes(gpu.data[job.id]) == big.encode()
    spec = from_map(FinetuneSpec, gpu.asks[-1][1]["spec"])
    assert (spec.base, spec.pairs, spec.convert) == ("hf:org/base-model", 25, True)
    assert spec.data_sha256 == sha(big.encode()) and spec.cards == ["GPU-b"]
    # kept, with its audit entry
    rows = await plane.store.finetunes.list()
    assert [r.id for r in rows] == [job.id]
    log = await plane.store.audit_log(actor="admin@test")
    assert any(e["action"] == "finetune.create" and e["target"] == job.id for e in log)


async def test_a_node_that_refuses_fails_the_job(plane: Plane) -> None:
    plane.node("n1").refuse = "no uv on this node"
    job = await plane.service.create(ask(), ADMIN)
    assert job.state == "failed" and "no uv on this node" in (job.error or "")


async def test_progress_then_the_adapter_in_pieces(plane: Plane) -> None:
    end = plane.node("n1")
    job = await plane.service.create(ask(), ADMIN)
    svc = plane.service
    svc.report("n1", FinetuneStatus(id=job.id, state="training", step=1, steps=3, loss=[2.5]))
    svc.report(
        "n1",
        FinetuneStatus(
            id=job.id, state="training", step=3, loss_at=1, loss=[2.0, 1.5], peak_mib=812.5
        ),
    )
    svc.report("other", FinetuneStatus(id=job.id, state="failed"))  # not its node: ignored
    now = svc.find(job.id)
    assert (now.state, now.step, now.steps, now.loss, now.peak_mib) == (
        "training",
        3,
        3,
        (2.5, 2.0, 1.5),
        812.5,
    )
    adapter = bytes(range(256)) * (PIECE // 256 * 2 + 10)  # two pieces and a bit
    end.adapters[job.id] = adapter
    svc.report(
        "n1",
        FinetuneStatus(
            id=job.id,
            state="uploading",
            adapter_bytes=len(adapter),
            adapter_sha256=sha(adapter),
            adapter_kind="gguf",
        ),
    )
    await pass_until(svc, lambda: svc.find(job.id).ended)
    done = svc.find(job.id)
    assert done.state == "succeeded" and done.adapter_bytes == len(adapter)
    assert end.kinds()[-4:] == ["finetune.piece"] * 3 + ["finetune.forget"]
    assert await plane.store.finetunes.adapter(job.id) == adapter
    found = await svc.adapter("tuned")
    assert found is not None and found[1] == adapter
    # a new leader reads it back from the store as it was
    again = FinetuneService(plane.store, plane, dict)
    await again.load()
    assert again.find(job.id).to_json() == done.to_json()


async def test_a_damaged_adapter_fails_the_job(plane: Plane) -> None:
    end = plane.node("n1")
    end.damage = lambda piece: piece[:-1] + b"!"
    job = await plane.service.create(ask(), ADMIN)
    adapter = b"x" * 1000
    end.adapters[job.id] = adapter
    plane.service.report(
        "n1",
        FinetuneStatus(
            id=job.id, state="uploading", adapter_bytes=1000, adapter_sha256=sha(adapter)
        ),
    )
    await pass_until(plane.service, lambda: plane.service.find(job.id).ended)
    failed = plane.service.find(job.id)
    assert failed.state == "failed" and "arrived damaged" in (failed.error or "")
    assert await plane.store.finetunes.adapter(job.id) is None


async def test_a_lost_node_fails_its_job_and_a_reporting_one_carries_on(plane: Plane) -> None:
    plane.node("n1")
    plane.node("n2")
    svc = plane.service
    lost = await svc.create(ask(node="n1"), ADMIN)
    kept = await svc.create(ask(node="n2", name="other"), ADMIN)
    plane.clock[0] += 2.5
    svc.report("n2", FinetuneStatus(id=kept.id, state="training", step=1))
    await svc.tick()
    assert svc.find(lost.id).state == "preparing"  # within the timeout (3 s)
    plane.clock[0] += 1.0
    await svc.tick()
    assert svc.find(lost.id).state == "failed"
    assert "node n1 lost" in (svc.find(lost.id).error or "")
    assert svc.find(kept.id).state == "training"
    # a new leader: the clocks start again; the job its node still reports carries on
    leader = FinetuneService(plane.store, plane, dict, clock=lambda: plane.clock[0])
    await leader.load()
    assert leader.find(kept.id).state == "training" and leader.find(lost.id).state == "failed"
    plane.clock[0] += 2.0
    leader.report("n2", FinetuneStatus(id=kept.id, state="training", step=2, loss=[1.0, 0.9]))
    plane.clock[0] += 2.0
    await leader.tick()
    assert leader.find(kept.id).state == "training" and leader.find(kept.id).step == 2
    # what the node said is written for whoever leads next
    rows = {r.id: r for r in await plane.store.finetunes.list()}
    assert '"step": 2' in rows[kept.id].doc


async def test_cancel_tells_the_node_and_is_audited(plane: Plane) -> None:
    end = plane.node("n1")
    job = await plane.service.create(ask(), ADMIN)
    done = await plane.service.cancel(job.id, ADMIN)
    assert done.state == "cancelled" and ("finetune.cancel", {"id": job.id}) in end.asks
    await asked(end, "finetune.forget")  # the node deletes what it kept of the job
    with pytest.raises(Refusal) as caught:
        await plane.service.cancel(job.id, ADMIN)
    assert caught.value.status == 409
    # the node's late word changes nothing
    plane.service.report("n1", FinetuneStatus(id=job.id, state="training"))
    assert plane.service.find(job.id).state == "cancelled"
    log = await plane.store.audit_log(actor="admin@test")
    assert any(e["action"] == "finetune.cancel" for e in log)
    # the node is free again
    await plane.service.create(ask(name="next"), ADMIN)


async def pass_until(svc: FinetuneService, done: object) -> None:
    import asyncio

    assert callable(done)
    for _ in range(200):
        await svc.tick()
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the job did not end")


async def asked(end: AgentEnd, kind: str) -> None:
    """Wait for the service's background ask of ``kind``."""
    async with asyncio.timeout(5):
        while kind not in end.kinds():
            await asyncio.sleep(0.01)


async def test_a_failure_the_node_reports_is_audited_and_its_job_forgotten(plane: Plane) -> None:
    end = plane.node("n1")
    job = await plane.service.create(ask(), ADMIN)
    plane.service.report("n1", FinetuneStatus(id=job.id, state="failed", error="CUDA OOM"))
    failed = plane.service.find(job.id)
    assert failed.state == "failed" and failed.error == "CUDA OOM"
    await asked(end, "finetune.forget")
    async with asyncio.timeout(5):
        while not any(
            e["action"] == "finetune.failed" and e["detail"] == "CUDA OOM"
            for e in await plane.store.audit_log(actor="admin@test")
        ):
            await asyncio.sleep(0.01)
    rows = {r.id: r for r in await plane.store.finetunes.list()}
    assert rows[job.id].state == "failed"
