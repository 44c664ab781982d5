"""The node's own metrics, as its agent serves them: written from what goes out on the
stream (Register, heartbeats, shard statuses), old or unread figures left out, and
``/metrics`` answered only with the cluster's metrics token."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web

from llmgw.agent.metricsport import MetricsPort, NodeMetrics
from llmgw.wire.hardware import GpuHealth, NodeVitals, gpu_figures
from llmgw.wire.messages import Heartbeat, Register, ShardStatus, ShardUsage
from llmgw.wire.states import ShardState
from tests.support.nodefacts import card, facts
from tests.support.ports import free_port

TOKEN = "llmgw-metrics-" + "a" * 40


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sample(text: str, name: str, *labels: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(label in line for label in labels):
            return line.rsplit(" ", 1)[1]
    return None


def node(clock: Clock) -> NodeMetrics:
    metrics = NodeMetrics("gpu01", clock)
    host = facts(
        cpu_count=64,
        memory_total=512 * 2**30,
        memory_available=500 * 2**30,
        gpus=[card(0, temperature=50, uuid="GPU-a")],
        cuda_version="13.0",
    )
    metrics.sent(Register(node_id="gpu01", version="1", host=host))
    return metrics


def test_figures_follow_the_heartbeats_and_old_or_unread_ones_are_left_out() -> None:
    clock = Clock()
    metrics = node(clock)
    text = metrics.text()
    where = 'node="gpu01",gpu="0",uuid="GPU-a"'
    assert sample(text, "llmgw_gpu_temperature_celsius", where) == "50"
    assert sample(text, "llmgw_node_cpus", 'node="gpu01"') == "64"
    assert "llmgw_node_up{" not in text and "# TYPE llmgw_node_up" not in text

    clock.now += 5
    metrics.sent(ShardStatus("r1", ShardState.READY, source="hf:org/model"))
    metrics.sent(
        Heartbeat(
            seq=1,
            gpus=[card(0, temperature=61, uuid="GPU-a")],
            gpu_health=[GpuHealth(uuid="GPU-a", index=0, ecc_volatile_uncorrected=2)],
            vitals=NodeVitals(cpu_power={"package0": 180.5}),
            health_warnings=["pcie: card 0 runs at x8. Fix: reseat it"],
            shards=[ShardUsage("r1", cpu_percent=150.0, rss=2**30)],
            # The slow figures were read 20 s before this beat.
            ages={"gpu_health": 20.0},
        )
    )
    text = metrics.text()
    assert sample(text, "llmgw_gpu_temperature_celsius", where) == "61"
    assert sample(text, "llmgw_gpu_ecc_errors_total", where, 'scope="volatile"') == "2"
    assert sample(text, "llmgw_node_cpu_power_watts", 'package="package0"') == "180.5"
    assert sample(text, "llmgw_node_warnings", 'kind="pcie"') == "1"
    assert sample(text, "llmgw_shard_cpu_cores", 'replica="r1"', 'model="hf:org/model"') == "1.5"

    # 15 s on: the slow figures are 35 s old, past 30 s; the cards' are 15 s.
    clock.now += 15
    text = metrics.text()
    assert sample(text, "llmgw_gpu_ecc_errors_total", where) is None
    assert sample(text, "llmgw_gpu_temperature_celsius", where) == "61"

    # The agent says it could not read the cards lately: their figures go.
    metrics.sent(Heartbeat(seq=2, unread=["gpus"]))
    assert sample(metrics.text(), "llmgw_gpu_temperature_celsius", where) is None
    # And when no heartbeat came for long (the stream is down), nothing moving is left.
    clock.now += 60
    text = metrics.text()
    assert sample(text, "llmgw_node_cpu_power_watts") is None
    assert sample(text, "llmgw_node_memory_available_bytes") is None
    assert sample(text, "llmgw_node_memory_total_bytes", 'node="gpu01"') == str(512 * 2**30)


def test_a_heartbeat_of_moving_figures_alone_moves_the_cards() -> None:
    """To a control plane that takes them, the agent sends its cards' moving figures
    alone (``gpu_figures``) while their steady facts are as last sent: the node's own
    metrics lay them over the cards it last sent whole, as the control plane does."""
    clock = Clock()
    metrics = node(clock)
    where = 'node="gpu01",gpu="0",uuid="GPU-a"'
    clock.now += 5
    whole = card(0, temperature=55, utilization=10, uuid="GPU-a")
    metrics.sent(Heartbeat(seq=1, gpus=[whole]))
    for seq, (temperature, busy) in enumerate([(61, 40), (67, 90)], start=2):
        clock.now += 5
        moving = gpu_figures(replace(whole, temperature=temperature, utilization=busy))
        metrics.sent(Heartbeat(seq=seq, gpu_figures=[moving]))
        text = metrics.text()
        assert sample(text, "llmgw_gpu_temperature_celsius", where) == str(temperature)
        assert sample(text, "llmgw_gpu_busy_ratio", where) == str(busy / 100)
        # Its steady facts are the whole card's.
        assert sample(text, "llmgw_gpu_info", where, 'bus_id="') == "1"
    # Figures for cards it never had whole are no card's figures of now.
    clock.now += 5
    two = [gpu_figures(whole), gpu_figures(replace(whole, index=1))]
    metrics.sent(Heartbeat(seq=9, gpu_figures=two, ages={"gpus": 0.0}))
    assert sample(metrics.text(), "llmgw_gpu_temperature_celsius", where) is None


async def test_a_scrape_needs_the_clusters_metrics_token() -> None:
    listen = f"127.0.0.1:{free_port()}"
    port = MetricsPort(listen, node(Clock()))
    await port.start()
    try:
        async with aiohttp.ClientSession() as http:

            async def get(token: str | None) -> tuple[int, str]:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with http.get(f"http://{listen}/metrics", headers=headers) as answer:
                    return answer.status, await answer.text()

            status, text = await get(TOKEN)
            assert status == 503 and "not been given" in text  # before the control plane said
            port.take_token(TOKEN)
            status, text = await get(None)
            assert status == 401 and "metrics.token" in text
            status, text = await get("llmgw-metrics-" + "b" * 40)
            assert status == 403
            status, text = await get(TOKEN)
            assert status == 200 and 'llmgw_gpu_info{node="gpu01"' in text
            assert port.refused == 3
    finally:
        await port.close()


LLAMACPP = Path(__file__).parent.parent / "fixtures" / "engines" / "llamacpp-0c1e570.metrics"


async def test_the_nodes_engines_own_families_come_relabelled() -> None:
    """An engine (llama-server's recorded /metrics behind its key) scraped with the
    node's families, as the control plane writes them: renamed, with model and replica."""

    async def engine(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer engine-key":
            return web.Response(status=401)
        return web.Response(text=LLAMACPP.read_text())

    app = web.Application()
    app.router.add_get("/metrics", engine)
    runner = web.AppRunner(app)
    await runner.setup()
    engine_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    listen = f"127.0.0.1:{free_port()}"
    url = f"http://127.0.0.1:{engine_port}/metrics"
    port = MetricsPort(listen, node(Clock()), lambda: [("tiny", "r1", url, "engine-key")])
    port.take_token(TOKEN)
    await port.start()
    try:
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with http.get(f"http://{listen}/metrics", headers=headers) as answer:
                text = await answer.text()
        assert 'llmgw_gpu_info{node="gpu01"' in text
        assert sample(text, "llamacpp_prompt_tokens_total", 'model="tiny",replica="r1"')
        assert "llamacpp:" not in text.replace("(named llamacpp:", "")
    finally:
        await port.close()
        await runner.cleanup()
