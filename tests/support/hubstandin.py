"""A Hugging Face hub stand-in on loopback for the model explorer: the listing
(``GET /api/models``), a repository (``GET /api/models/{org}/{repo}``) and its tree
(``GET /api/models/{org}/{repo}/tree/main``), in the hub API's own shapes (as
``huggingface_hub``'s ``ModelInfo`` reads them: ``gguf`` with ``total``,
``architecture`` and ``context_length``; ``safetensors`` with ``parameters`` per dtype
and ``total``; ``config.quantization_config``; ``siblings`` of ``rfilename``; the tree's
``type``/``path``/``size``/``lfs``).

``TRENDING`` is a trending hundred: real repositories with their real parameter counts
and dtype breakdowns (GGUF and safetensors, FP8, AWQ, MXFP4, MLX, a picture model, an
embedding model, a gated one), then repositories named ``trend/NN-...`` to make a
hundred, in sizes from half a billion to a hundred and twenty billion parameters.

``mode``: ``ok``; ``stall`` (accepts, then never answers); ``garbage`` (an HTML page);
``wrong`` (JSON, but an object where a list belongs).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from aiohttp import web

from tests.support.ports import free_port

GGUF_QUANTS = {"Q2_K": 2.96, "Q4_K_M": 4.9, "Q8_0": 8.5, "F16": 16.0}


def _gguf(repo: str, total: int, arch: str, context: int, **more: Any) -> dict[str, Any]:
    return {
        "id": repo,
        "library_name": "gguf",
        "pipeline_tag": "text-generation",
        "tags": ["gguf", "text-generation", "conversational"],
        "gguf": {"total": total, "architecture": arch, "context_length": context},
        **more,
    }


def _safetensors(repo: str, params: dict[str, int], model_type: str, **more: Any) -> dict[str, Any]:
    quant = more.pop("quant", None)
    config: dict[str, Any] = {"model_type": model_type, "architectures": ["AutoModel"]}
    if quant is not None:
        config["quantization_config"] = quant
    return {
        "id": repo,
        "library_name": more.pop("library_name", "transformers"),
        "pipeline_tag": more.pop("pipeline_tag", "text-generation"),
        "tags": ["transformers", "safetensors", *more.pop("tags", [])],
        "safetensors": {"parameters": params, "total": sum(params.values())},
        "config": config,
        **more,
    }


def _trending() -> list[dict[str, Any]]:
    real = [
        _gguf("unsloth/Qwen3-8B-GGUF", 8_190_735_360, "qwen3", 40960),
        _gguf("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", 8_030_261_312, "llama", 131072),
        _gguf("Qwen/Qwen2.5-0.5B-Instruct-GGUF", 630_167_424, "qwen2", 32768),
        _gguf("unsloth/gpt-oss-20b-GGUF", 20_914_757_184, "gpt-oss", 131072),
        _gguf("unsloth/Qwen3-30B-A3B-GGUF", 30_532_122_624, "qwen3moe", 40960),
        _gguf("unsloth/DeepSeek-R1-GGUF", 671_026_419_200, "deepseek2", 163840),
        _gguf("ggml-org/gemma-3-4b-it-GGUF", 3_880_263_168, "gemma3", 131072),
        _gguf("unsloth/Llama-3.3-70B-Instruct-GGUF", 70_553_706_560, "llama", 131072),
        _safetensors("Qwen/Qwen3-8B", {"BF16": 8_190_735_360}, "qwen3"),
        _safetensors(
            "meta-llama/Llama-3.1-8B-Instruct", {"BF16": 8_030_261_248}, "llama", gated="manual"
        ),
        _safetensors(
            "openai/gpt-oss-20b",
            {"BF16": 1_804_459_584, "U8": 9_555_148_800},
            "gpt_oss",
            quant={"quant_method": "mxfp4"},
        ),
        _safetensors(
            "Qwen/Qwen3-30B-A3B-FP8",
            {"F8_E4M3": 29_972_000_000, "BF16": 560_000_000, "F32": 3_000_000},
            "qwen3_moe",
            quant={"quant_method": "fp8", "fmt": "e4m3"},
        ),
        _safetensors(
            "Qwen/Qwen2.5-7B-Instruct-AWQ",
            {"I32": 822_083_584, "F16": 1_089_994_752},
            "qwen2",
            quant={"quant_method": "awq", "bits": 4},
            tags=["awq", "4-bit"],
        ),
        _safetensors(
            "deepseek-ai/DeepSeek-V3",
            {"BF16": 3_918_786_560, "F8_E4M3": 680_571_043_840, "F32": 41_555_600},
            "deepseek_v3",
            quant={"quant_method": "fp8"},
        ),
        _safetensors(
            "mlx-community/Qwen3-8B-4bit",
            {"BF16": 157_000_000, "U32": 1_024_000_000},
            "qwen3",
            library_name="mlx",
            tags=["mlx"],
        ),
        _safetensors("google/gemma-3-27b-it", {"BF16": 27_432_406_640}, "gemma3", gated="manual"),
        _safetensors("microsoft/Phi-4-mini-instruct", {"BF16": 3_836_021_760}, "phi3"),
        _safetensors(
            "sentence-transformers/all-MiniLM-L6-v2",
            {"I64": 512, "F32": 22_713_216},
            "bert",
            pipeline_tag="sentence-similarity",
            library_name="sentence-transformers",
        ),
        {
            "id": "black-forest-labs/FLUX.1-dev",
            "library_name": "diffusers",
            "pipeline_tag": "text-to-image",
            "tags": ["diffusers", "text-to-image"],
            "siblings": [{"rfilename": "flux1-dev.safetensors"}],
        },
    ]
    sizes = [0.5e9, 1.5e9, 3e9, 7e9, 14e9, 32e9, 72e9, 120e9]
    filler: list[dict[str, Any]] = []
    n = 0
    while len(real) + len(filler) < 100:
        params = int(sizes[n % len(sizes)] * (1 + (n % 5) / 50))
        if n % 2:
            filler.append(_gguf(f"trend/{n:02d}-m{n}-GGUF", params, "llama", 32768))
        else:
            filler.append(_safetensors(f"trend/{n:02d}-m{n}", {"BF16": params}, "llama"))
        n += 1
    listed = real + filler
    for i, repo in enumerate(listed):
        repo.update(downloads=10_000 * (100 - i), likes=100 - i, trendingScore=1000 - 7 * i)
        if "gguf" in repo or "safetensors" in repo:
            repo["siblings"] = [{"rfilename": f["path"]} for f in tree(repo)]
    return listed


def tree(repo: dict[str, Any]) -> list[dict[str, Any]]:
    """A repository's files with their sizes, as the tree listing answers them."""

    def lfs(path: str, size: int) -> dict[str, Any]:
        return {
            "type": "file",
            "oid": "0" * 40,
            "size": size,
            "path": path,
            "lfs": {
                "oid": hashlib.sha256(path.encode()).hexdigest(),
                "size": size,
                "pointerSize": 134,
            },
        }

    files = [{"type": "file", "oid": "1" * 40, "size": 2048, "path": "README.md"}]
    if "gguf" in repo:
        stem = repo["id"].split("/")[1].removesuffix("-GGUF")
        for quant, bits in GGUF_QUANTS.items():
            size = int(repo["gguf"]["total"] * bits / 8)
            if size > 48 * 10**9:  # the hub's 50 GB limit: split
                parts = size // (40 * 10**9) + 1
                for p in range(1, parts + 1):
                    name = f"{quant}/{stem}-{quant}-{p:05d}-of-{parts:05d}.gguf"
                    files.append(lfs(name, size // parts))
            else:
                files.append(lfs(f"{stem}-{quant}.gguf", size))
        files.append(lfs("mmproj-F16.gguf", 851_000_000))
    if "safetensors" in repo:
        widths = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U32": 4, "I64": 8, "U8": 1}
        total = sum(n * widths.get(d, 1) for d, n in repo["safetensors"]["parameters"].items())
        shards = total // (5 * 10**9) + 1
        for s in range(1, shards + 1):
            name = f"model-{s:05d}-of-{shards:05d}.safetensors"
            files.append(lfs(name, total // shards))
        files.append({"type": "file", "oid": "2" * 40, "size": 700, "path": "config.json"})
    return files


TRENDING = _trending()


class HubStandIn:
    def __init__(self, mode: str = "ok", repos: list[dict[str, Any]] | None = None) -> None:
        self.mode = mode
        self.repos = TRENDING if repos is None else repos
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.asked: list[web.Request] = []
        self.runner: web.AppRunner | None = None
        self.release = asyncio.Event()

    def _by_id(self) -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in self.repos}

    async def _answer(self, request: web.Request, body: object) -> web.Response:
        self.asked.append(request)
        if self.mode == "stall":
            # Until the stand-in closes: then the answer goes to no one.
            await self.release.wait()
        if self.mode == "garbage":
            return web.Response(text="<html><body>502 Bad Gateway</body></html>", status=200)
        if self.mode == "wrong":
            body = {"error": "Sorry, this is not the model listing"}
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    async def listing(self, request: web.Request) -> web.Response:
        q = request.query
        found = self.repos
        if q.get("search"):
            found = [r for r in found if q["search"].lower() in r["id"].lower()]
        if q.get("filter") == "gguf":
            found = [r for r in found if "gguf" in r.get("tags", [])]
        expand = set(q.getall("expand", []))
        shown = [
            {k: v for k, v in r.items() if k == "id" or not expand or k in expand}
            for r in found[: int(q.get("limit", "100"))]
        ]
        return await self._answer(request, shown)

    async def repository(self, request: web.Request) -> web.Response:
        repo = self._by_id().get(f"{request.match_info['org']}/{request.match_info['repo']}")
        if repo is None:
            self.asked.append(request)
            return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
        return await self._answer(request, repo)

    async def files(self, request: web.Request) -> web.Response:
        repo = self._by_id().get(f"{request.match_info['org']}/{request.match_info['repo']}")
        if repo is None:
            return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
        return await self._answer(request, tree(repo))

    async def __aenter__(self) -> HubStandIn:
        app = web.Application()
        app.router.add_get("/api/models", self.listing)
        app.router.add_get("/api/models/{org}/{repo}/tree/main", self.files)
        app.router.add_get("/api/models/{org}/{repo}", self.repository)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        if self.runner is not None:
            await self.runner.cleanup()
