"""What every engine adapter gives the supervisor: its command line, environment,
readiness rule, metrics path, refused flags, how to ask its version, and how to read
its start-up output; and ``wait_ready``, the readiness poll over HTTP.

One adapter a file (``llamacpp.py``, ``vllm.py``, ``sglang.py``, ``freetoken.py``,
``tensorrt.py``); adding an engine is adding a file and naming it in ``ADAPTERS``.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import aiohttp

from llmgw.agent.discovery.mig import cuda_visible_devices
from llmgw.modelkit.engineenv import EnvError, check_env
from llmgw.modelkit.enginerules import RULES
from llmgw.wire.messages import AdapterSpec, Compute, ShardSpec


class EngineError(ValueError):
    """A shard this engine cannot run as asked; the message names what and the fix."""


class EngineAdapter(abc.ABC):
    name: ClassVar[str]
    # Environment variable the engine reads its API key from; None when it takes the key
    # only as an argument (SGLang).
    key_env: ClassVar[str | None]
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str] = "/metrics"
    # A path that answers only with the key: how a found process is told to be ours.
    models_path: ClassVar[str] = "/v1/models"
    # A worker of a replica spanning nodes (rank 1..): whether it reads the weights
    # itself, and how it is known to be up: "http" (its health path answers), "tcp"
    # (its port takes a connection) or "process" (it runs; it listens on nothing).
    worker_needs_weights: ClassVar[bool] = True
    worker_probe: ClassVar[str] = "http"
    # Whether the leader must wait for its workers to listen before it starts.
    leader_waits: ClassVar[bool] = False
    # Whether it loads LoRA adapters (``ShardSpec.adapters``) beside the model.
    serves_lora: ClassVar[bool] = False
    # How it takes images (``llmgw.agent.weights.projector.prepare``): "projector" (a
    # GGUF model's mmproj file beside it), "config" (the model's config.json says), None.
    images: ClassVar[str | None] = None
    # Whether the ranks of a replica spanning nodes meet over NCCL and torch's gloo,
    # which listen on ports the kernel picks (``llmgw.agent.ephemeral``); llama.cpp's
    # RPC workers listen only on the port they are given.
    collective: ClassVar[bool] = False

    @property
    def multi_card(self) -> bool:
        """False for engines given one card per shard (``llmgw.modelkit.enginerules``)."""
        return RULES[self.name].multi_card

    def refused_flag(self, args: Sequence[str]) -> str | None:
        """The first argument that reads files, fetches, moves files or picks devices
        (as this engine parses its arguments), or None when all may pass."""
        return RULES[self.name].refused_flag(args)

    def check(self, spec: ShardSpec) -> None:
        """Refuse a spec this engine must not run, naming the field and the fix."""
        try:
            check_env(self.name, spec.env)
        except EnvError as exc:
            raise EngineError(f"{self.name} environment: {exc}") from None
        flag = self.refused_flag(spec.args)
        if flag is not None:
            raise EngineError(
                f"{self.name} argument {flag!r} is not allowed: llmgw chooses the model "
                "file, devices and paths itself; remove it from the profile's arguments"
            )
        if len(spec.cards) > 1 and not self.multi_card:
            raise EngineError(f"{self.name} runs on one card; give the profile 1 card")
        rules = RULES[self.name]
        if not spec.cards and not rules.runs_on_cpu:
            raise EngineError(f"{self.name} runs on cards only; give the profile 1 card or more")
        if spec.group is not None and not rules.spans_nodes:
            raise EngineError(
                f"llmgw runs a {self.name} replica on one node; give the profile 1 node"
            )
        try:
            cuda_visible_devices(spec.cards)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        if spec.adapters and not self.serves_lora:
            raise EngineError(
                f"{self.name} is not given LoRA adapters by llmgw; serve the model with "
                "llama.cpp or vllm, or remove its adapters"
            )

    def lora_path(self, fetched: Path) -> str:
        """Where the engine loads a LoRA adapter from, given where its source was
        fetched to; EngineError when it cannot load that."""
        return str(fetched)

    def lora_args(self, spec: ShardSpec) -> list[str]:
        """The flags that load ``spec.adapters`` (each fetched: its ``path`` set)."""
        return []

    @abc.abstractmethod
    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        """The full argv. The key never goes here unless the engine takes it only so."""

    def worker_command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        """The argv of a worker (rank 1..) of a replica spanning nodes; the engines that
        run one command on every node give ``command``'s, which reads ``spec.group``."""
        return self.command(binary, spec, model_path, host)

    def environment(self, spec: ShardSpec) -> dict[str, str]:
        """Variables added to the engine's environment: the profile's own (checked by
        ``check``), then the key and visible cards, which no profile overrides."""
        env: dict[str, str] = dict(spec.env)
        # An empty key (a cluster without a store to keep the secret) means no key: an
        # engine given "" would demand an empty bearer token instead.
        if self.key_env and spec.key:
            env[self.key_env] = spec.key
        # Always set, so a shard given no card sees none rather than all of them; a MIG
        # device is named by its MIG UUID, the form CUDA selects it by.
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(spec.cards)
        if spec.group is not None and spec.group.nvlink:
            # Every card in one NVLink domain: NCCL joins them over NVLink across the
            # trays (through IMEX) rather than the network; cuMem must stay on for it.
            env["NCCL_MNNVL_ENABLE"] = "1"
            env["NCCL_CUMEM_ENABLE"] = "1"
        return env

    def ready(self, status: int, body: bytes) -> bool:
        """Whether a health answer means serving; a 200 that says "loading" is not."""
        return status == 200 and b"loading" not in body.lower()

    def parse_startup(self, lines: Sequence[str]) -> Compute:
        """What the engine said it runs on; engines that say nothing give an empty one."""
        return Compute()

    def version_command(self, binary: str) -> list[str]:
        """The argv that makes the engine say its version and exit 0."""
        return [binary, "--version"]

    def parse_version(self, output: str) -> str | None:
        """The version in what ``version_command`` printed; None when it names none."""
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        return lines[-1] if lines else None


def fetched_path(adapter: AdapterSpec) -> str:
    """Where the agent put a LoRA adapter; EngineError for one it did not fetch."""
    if not adapter.path:
        raise EngineError(f"LoRA adapter {adapter.name} ({adapter.source}) was not fetched")
    return adapter.path


async def wait_ready(
    adapter: EngineAdapter,
    port: int,
    timeout: float,
    *,
    host: str = "127.0.0.1",
    key: str | None = None,
    interval: float = 0.5,
    alive: Callable[[], bool] | None = None,
) -> bool:
    """Poll the engine's health path until it is ready (True), ``timeout`` seconds pass
    or ``alive`` says the process is gone (False). A refused connection is an engine
    still starting: vLLM listens only once it is ready."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    url = f"http://{host}:{port}{adapter.health_path}"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while True:
            if alive is not None and not alive():
                return False
            try:
                async with http.get(url, headers=headers) as resp:
                    if adapter.ready(resp.status, await resp.read()):
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(interval, remaining))
