"""parse_dcgm_exporter on dcgm-exporter pages (fixtures/dcgm) and on hand-made lines
for the exposition format's corners; scrape_dcgm_exporter against a small aiohttp
server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.agent.discovery.dcgm import (
    MAX_BODY,
    ProfCounters,
    parse_dcgm_exporter,
    scrape_dcgm_exporter,
)
from tests.support.ports import free_port

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"
H100_0 = "GPU-3f5a9c1e-7b2d-4e8a-9c61-0d2e4f6a8b10"
H100_1 = "GPU-8e1b7d42-c3a9-4f05-b6d8-91a2c3e4f5d7"
A100_MIG = "GPU-5d0c2b7e-1a93-4c6f-8e24-b7f90a1c3d58"
A100_WHOLE = "GPU-a41e6f09-2d7b-4b3c-95e8-0c6d7e8f9a12"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_two_h100s() -> None:
    cards = parse_dcgm_exporter(fixture("dcgm-exporter_2xH100.txt"))
    assert cards == {
        H100_0: ProfCounters(0.912345, 0.287613, 0.44321, 0.623456),
        H100_1: ProfCounters(0.0, 0.0, 0.0, 0.000012),
    }


def test_mig_instances_keyed_under_parent_uuid() -> None:
    cards = parse_dcgm_exporter(fixture("dcgm-exporter_2xA100_mig.txt"))
    assert set(cards) == {
        f"{A100_MIG}/1",
        f"{A100_MIG}/5",
        f"{A100_MIG}/13",
        A100_WHOLE,
    }
    assert cards[f"{A100_MIG}/13"] == ProfCounters(0.9711, 0.330012, 0.501234, 0.287654)
    assert cards[f"{A100_MIG}/5"].sm_active == 0.0


def test_escaped_label_values_and_comments() -> None:
    text = (
        '# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles, "quoted" {braces}.\n'
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
        '# DCGM_FI_PROF_SM_ACTIVE{gpu="9",UUID="GPU-comment"} 0.9\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",modelName="Card \\"X\\", rev}=2",'
        'note="back\\\\slash\\nline",UUID="GPU-aa"} 0.5 1712345678000\n'
        'DCGM_FI_PROF_SM_ACTIVE { gpu = "1" , UUID = "GPU-bb" , } 0.25\n'
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-\\"q\\",\\\\x\\n"} 0.75\n'
    )
    assert parse_dcgm_exporter(text) == {
        "GPU-aa": ProfCounters(sm_active=0.5),
        "GPU-bb": ProfCounters(sm_active=0.25),
        'GPU-"q",\\x\n': ProfCounters(sm_active=0.75),
    }


def test_nan_blank_and_out_of_range_are_none() -> None:
    text = (
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aa"} NaN\n'
        'DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",UUID="GPU-aa"} 9223372036854775794\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-aa"} 140737488355328\n'
        'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-aa"} -0.5\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-bb"} +Inf\n'
        'DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-bb"} 1.0000004\n'
    )
    assert parse_dcgm_exporter(text) == {
        "GPU-aa": ProfCounters(None, None, None, None),
        "GPU-bb": ProfCounters(sm_active=None, dram_active=1.0),
    }


def test_index_fallback_without_uuid_and_old_namespace_label() -> None:
    text = (
        'DCGM_FI_PROF_SM_ACTIVE{gpu="3"} 0.1\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="2",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 0.2\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="4",uuid="GPU-old"} 0.3\n'
        "DCGM_FI_PROF_SM_ACTIVE 0.4\n"  # no card named: dropped
    )
    assert parse_dcgm_exporter(text) == {
        "index:3": ProfCounters(sm_active=0.1),
        "index:2/7": ProfCounters(sm_active=0.2),
        "GPU-old": ProfCounters(sm_active=0.3),
    }


def test_malformed_lines_skipped_duplicates_keep_first() -> None:
    text = (
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aa} 0.9\n'  # unterminated value
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0" UUID="GPU-aa"} 0.9\n'  # no comma
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aa"}\n'  # no value
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aa"} zero\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aa",pod="a"} 0.6\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aa",pod="b"} 0.7\n'
        'DCGM_FI_PROF_SM_ACTIVE_EXTRA{gpu="0",UUID="GPU-cc"} 0.7\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-dd"} 50\n'
    )
    assert parse_dcgm_exporter(text) == {"GPU-aa": ProfCounters(sm_active=0.6)}


def test_empty_page() -> None:
    assert parse_dcgm_exporter("") == {}
    assert parse_dcgm_exporter("# HELP x y\n# TYPE x gauge\n") == {}


# --- scrape -----------------------------------------------------------------------


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}/metrics"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_scrape_reads_the_page(serve: Callable[[Handler], Awaitable[str]]) -> None:
    page = fixture("dcgm-exporter_2xH100.txt")

    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(text=page, content_type="text/plain")

    url = await serve(metrics)
    assert await scrape_dcgm_exporter(url) == parse_dcgm_exporter(page)


async def test_scrape_non_200_is_none(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text=fixture("dcgm-exporter_2xH100.txt"))

    assert await scrape_dcgm_exporter(await serve(metrics)) is None


async def test_scrape_timeout_is_none(serve: Callable[[Handler], Awaitable[str]]) -> None:
    release = asyncio.Event()

    async def metrics(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="")

    assert await scrape_dcgm_exporter(await serve(metrics), timeout=0.2) is None
    release.set()  # so that the server's cleanup need not wait for the handler


async def test_scrape_nothing_listening_is_none() -> None:
    assert await scrape_dcgm_exporter(f"http://127.0.0.1:{free_port()}/metrics") is None
    assert await scrape_dcgm_exporter("not a url") is None


async def test_scrape_refuses_oversized_bodies(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    line = b'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aa"} 0.5\n'
    big = line * (MAX_BODY // len(line) + 1)

    async def declared(request: web.Request) -> web.StreamResponse:
        return web.Response(body=big, content_type="text/plain")

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(0, len(big), 1 << 20):
            await response.write(big[i : i + (1 << 20)])
        await response.write_eof()
        return response

    assert await scrape_dcgm_exporter(await serve(declared), timeout=10) is None
    assert await scrape_dcgm_exporter(await serve(chunked), timeout=10) is None
    fits = line * (MAX_BODY // len(line))

    async def just_fits(request: web.Request) -> web.StreamResponse:
        return web.Response(body=fits, content_type="text/plain")

    assert await scrape_dcgm_exporter(await serve(just_fits), timeout=10) == {
        "GPU-aa": ProfCounters(sm_active=0.5)
    }
