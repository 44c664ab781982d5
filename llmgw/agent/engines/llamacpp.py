"""llama.cpp's llama-server: command line, key in LLAMA_API_KEY, refused flags as its
own parser reads them, and what its start-up output says it runs on.

The start-up lines read (from llama.cpp's ggml, llama and server logs)::

    ggml_cuda_init: found 1 CUDA devices:
      Device 0: NVIDIA H200, compute capability 9.0, VMM: yes
    load_backend: loaded CUDA backend from /opt/llama/libggml-cuda.so
    load_backend: loaded CPU backend from /opt/llama/libggml-cpu-haswell.so
    system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | ...
    llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:19:00.0) - ...
    load_tensors: offloaded 33/33 layers to GPU

A CPU build prints no "offloaded" line, or (built with an RPC backend, its default
``-ngl`` being all layers) one with no device named: ``offloaded_layers`` then stays
None, as layers on the CPU are offloaded nowhere. Older builds said
``llm_load_tensors:``; both are read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent.engines.base import EngineAdapter, EngineError, fetched_path
from llmgw.wire.messages import Compute, ShardSpec

_START = re.compile(
    r"\bload_backend: |\bggml_cuda_init: found |^build: \d+ \(|^--- llmgw: starting "
    r"|\bllama_server: initializing"
)
_BACKEND = re.compile(r"\bload_backend: loaded (\S+) backend from ")
_FOUND = re.compile(r"(?:^|\s)Device (\d+): ([^,]+), compute capability")
# Newer builds (at --verbosity 4) list devices as "common_param:   - CUDA0 : NAME (...)".
_DEVICE_INFO = re.compile(r"common_param:\s+- (\w+?\d+)\s*: (.+?) \(\d+ MiB")
_USING = re.compile(r"\busing device (\S+) \(([^)]*)\)")
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")
_SYSTEM_INFO = re.compile(r"\bsystem_info: n_threads = ")
_VERSION = re.compile(r"^version: (\d+) \((\w+)\)", re.MULTILINE)


@dataclass
class _Run:
    """What one run of the engine said; a log may hold several runs one after another."""

    backends: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    using: list[str] = field(default_factory=list)
    offloaded: tuple[int, int] | None = None
    cpu_seen: bool = False

    @property
    def past_start(self) -> bool:
        return self.cpu_seen or bool(self.using) or self.offloaded is not None


def parse_startup(lines: Sequence[str]) -> Compute:
    """What llama-server's start-up lines say it runs on, for the last run they hold."""
    run = _Run()
    for line in lines:
        if _START.search(line) and run.past_start:
            run = _Run()  # an earlier run's lines, kept in the same log file
        if m := _BACKEND.search(line):
            run.backends.append(m[1])
        elif m := _FOUND.search(line):
            run.found.append(f"CUDA{m[1]} ({m[2].strip()})")
        elif m := _USING.search(line):
            run.using.append(f"{m[1]} ({m[2]})")
        elif m := _DEVICE_INFO.search(line):
            run.found.append(f"{m[1]} ({m[2].strip()})")
        elif m := _OFFLOADED.search(line):
            run.offloaded = (int(m[1]), int(m[2]))
        elif _SYSTEM_INFO.search(line):
            run.cpu_seen = True
    # The devices the model was given; the ones CUDA found only when an older build
    # did not say which it used.
    devices = run.using or run.found
    if devices:
        backend: str | None = devices[0].split(" ", 1)[0].rstrip("0123456789") or None
    elif run.cpu_seen or run.backends or run.offloaded is not None:
        backend = "CPU"
    else:
        backend = None  # no start-up line read: say nothing rather than guess
    offloaded = run.offloaded if devices else None
    return Compute(
        backend=backend,
        devices=devices,
        offloaded_layers=offloaded[0] if offloaded else None,
        total_layers=offloaded[1] if offloaded else None,
    )


# The RPC worker beside llama-server in a release: renamed upstream (release b9824).
RPC_SERVERS = ("ggml-rpc-server", "rpc-server")


def rpc_server(binary: str) -> str:
    """The RPC server of the same build as ``binary`` (llama-server): the protocol
    refuses a worker of another version, so it is never looked for elsewhere."""
    folder = Path(binary).parent
    for name in RPC_SERVERS:
        found = folder / name
        if found.is_file() and os.access(found, os.X_OK):
            return str(found)
    raise EngineError(
        f"this llama.cpp build has no RPC server beside {binary} (looked for "
        f"{' or '.join(RPC_SERVERS)}): a replica spanning nodes needs a release built "
        "with GGML_RPC=ON, or `llmgw ctl engines set llama.cpp VERSION` naming one"
    )


class LlamaCppAdapter(EngineAdapter):
    """Several cards of one node split the model's layers between them (``--split-mode
    layer``, an equal ``--tensor-split``); the agent shows it only those cards.

    A replica spanning nodes runs llama-server on its leader, with ``--rpc`` naming
    an RPC server (``ggml-rpc-server``) on each other node; the model's layers are
    spread over the RPC devices. The RPC protocol has no key and no TLS, so a worker
    listens on its node's address alone and llmgw's firewall lets in only the
    replica's own nodes (and the control planes)."""

    name = "llama.cpp"
    key_env = "LLAMA_API_KEY"
    worker_needs_weights = False
    worker_probe = "tcp"
    leader_waits = True
    serves_lora = True
    images = "projector"

    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        argv = [binary, "-m", model_path, "--host", host, "--port", str(spec.port)]
        if spec.model:
            argv += ["--alias", spec.model]
        if spec.cpu_cores:
            argv += ["-t", str(spec.cpu_cores)]
        if spec.group is not None:
            rpc_server(binary)  # the same build must have one for the workers
            argv += ["--rpc", ",".join(spec.group.workers)]
        if spec.cards or spec.group is not None:
            # Every layer on the cards (or the RPC devices); llama.cpp caps the count
            # at the model's layers.
            argv += ["--n-gpu-layers", "999"]
        if len(spec.cards) > 1:
            # Whole layers to each card, in equal shares (the cards are of one class):
            # no tensor is cut, so the KV heads need not divide by the card count.
            argv += ["--split-mode", "layer", "--tensor-split", ",".join("1" * len(spec.cards))]
        # Verbosity 4 is what makes llama.cpp print its devices, backend buffers and
        # offloaded layers at start-up; without it the shard's compute is unknown.
        argv += ["--metrics", "--verbosity", "4"]
        if spec.projector:
            # The vision model's other half, found beside its GGUF by the node.
            argv += ["--mmproj", spec.projector]
        argv += self.lora_args(spec)
        return argv + list(spec.args)

    def lora_args(self, spec: ShardSpec) -> list[str]:
        """Every adapter loaded, in the spec's order (a request's ``lora`` ids are places
        in it), and applied to no request that does not ask for it.

        ``--lora-init-without-apply`` alone does not do that: current llama-server
        leaves the adapters at scale 1.0, so a request without ``lora`` gets all of them
        stacked (ggml-org/llama.cpp#28674). So each is loaded as ``--lora-scaled
        FILE:0`` (one flag, comma-separated: a repeated one is deprecated), and the flag
        stays for the builds that honour it."""
        if not spec.adapters:
            return []
        files = ",".join(f"{fetched_path(a)}:0" for a in spec.adapters)
        return ["--lora-scaled", files, "--lora-init-without-apply"]

    def lora_path(self, fetched: Path) -> str:
        """A LoRA GGUF: the file fetched, or the one ``.gguf`` in a fetched directory.
        ``--lora-scaled`` splits its value at ',' and ':', so a path holding either is
        refused."""
        path = fetched
        if fetched.is_dir():
            found = sorted(p for p in fetched.rglob("*.gguf") if p.is_file())
            if len(found) != 1:
                raise EngineError(
                    f"llama.cpp loads a LoRA adapter from one GGUF file; {fetched} holds "
                    f"{len(found)}: name the file in the source (hf:ORG/REPO:FILE.gguf)"
                )
            path = found[0]
        if "," in str(path) or ":" in str(path):
            raise EngineError(
                f"llama.cpp cannot be given a LoRA adapter whose path holds ',' or ':': {path}"
            )
        return str(path)

    def worker_command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        group = spec.group
        assert group is not None
        argv = [rpc_server(binary), "-H", group.bind or "127.0.0.1", "-p", str(spec.port)]
        if spec.cpu_cores:
            argv += ["-t", str(spec.cpu_cores)]
        return argv

    def parse_startup(self, lines: Sequence[str]) -> Compute:
        return parse_startup(lines)

    def parse_version(self, output: str) -> str | None:
        """``version: 1234 (abcdef0)`` as ``b1234``, the release tag's spelling. A
        build from a source tree without git says ``version: 0 (unknown)``: no version."""
        m = _VERSION.search(output)
        if m is None or int(m[1]) == 0:
            return None
        return f"b{m[1]}"
