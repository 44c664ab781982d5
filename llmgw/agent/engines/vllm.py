"""vLLM's OpenAI server (``vllm serve``): command line, key in VLLM_API_KEY, and the
flags refused as its argparse parser reads them, beginnings of long options included.

``binary`` is the ``vllm`` entry point of the environment vLLM is installed in. The
model is always a local path the agent fetched; the engine runs with the Hugging Face
hub offline, so nothing it is given can make it fetch.

``--hf-overrides`` is allowed: it is JSON that changes the model's config in memory,
reads no file, and with ``--trust-remote-code`` refused cannot bring in code.

A replica spanning nodes (``spec.group``) runs ``vllm serve`` on every node with the
multiprocessing executor (``--nnodes``/``--node-rank``/``--master-addr``, vLLM 0.11.1
and later; older vLLM needs Ray, which llmgw does not run). Each node's cards are one
pipeline stage: the tensor-parallel size is this node's card count and the
pipeline-parallel size the number of nodes. Rank 0 serves HTTP; ranks 1.. run
``--headless``, listen on no port of their own, and are known to be up by their
process alone. Beside ``--master-port`` (torch.distributed's rendezvous) the leader
binds its scheduler-to-worker message queues to ``--master-addr`` on ports it picks
at start, so the members must reach any of the leader's ports.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmgw.agent.engines.base import EngineAdapter, EngineError, fetched_path
from llmgw.wire.messages import GroupSpec, ShardSpec

# Engines fetch nothing: the agent fetched the model, and the hub stays shut.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

# The first vLLM whose ``vllm serve`` spans nodes without Ray (vllm-project/vllm#23691).
MULTINODE_SINCE = (0, 11, 1)

_VERSION = re.compile(r"v?(\d+(?:\.\d+)*)(.*)")
_PRE_RELEASE = re.compile(r"[-_.]?(a|alpha|b|beta|c|rc|pre|preview|dev)", re.IGNORECASE)


def load_format(spec: ShardSpec, model_path: str) -> list[str]:
    """``--load-format safetensors`` unless the model may load pickles, so a directory
    holding only ``.bin`` files fails to load rather than unpickling them. A GGUF file
    is read as GGUF by its name."""
    if spec.allow_pickle or model_path.endswith(".gguf"):
        return []
    return ["--load-format", "safetensors"]


def rendezvous(engine: str, spec: ShardSpec) -> tuple[GroupSpec, int] | None:
    """``spec.group`` and its rendezvous port, checked for what every engine meeting at
    the leader needs: a rank inside the group and the port; EngineError otherwise.
    None for a whole replica."""
    group = spec.group
    if group is None:
        return None
    if group.size < 1 or not 0 <= group.rank < group.size:
        raise EngineError(
            f"{engine} shard {spec.replica_id}: rank {group.rank} is not in a group of "
            f"{group.size} nodes; the control plane must give ranks 0..{group.size - 1}"
        )
    if group.rendezvous_port is None:
        raise EngineError(
            f"{engine} shard {spec.replica_id} spans {group.size} nodes but was given no "
            "rendezvous port on its leader; the control plane must name one "
            "(a control plane older than its agents may not: upgrade it)"
        )
    return group, group.rendezvous_port


def below(version: str, floor: tuple[int, ...]) -> bool:
    """Whether ``version`` names a release before ``floor`` (a pre-release of ``floor``
    included, as PEP 440 orders them); False when it is not a version at all."""
    m = _VERSION.fullmatch(version.strip())
    if m is None:
        return False
    release = tuple(int(n) for n in m[1].split("."))
    width = max(len(release), len(floor))
    release += (0,) * (width - len(release))
    floor += (0,) * (width - len(floor))
    if release != floor:
        return release < floor
    return bool(_PRE_RELEASE.match(m[2]))


class VllmAdapter(EngineAdapter):
    name = "vllm"
    key_env = "VLLM_API_KEY"
    collective = True
    # A headless worker starts only the executor's workers: it listens on no port.
    worker_probe = "process"
    serves_lora = True
    images = "config"

    def check(self, spec: ShardSpec) -> None:
        super().check(spec)
        self._group_args(spec)

    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        argv = [binary, "serve", model_path, "--host", host, "--port", str(spec.port)]
        if spec.model:
            argv += ["--served-model-name", spec.model]
        argv += ["--tensor-parallel-size", str(max(1, len(spec.cards)))]
        argv += self._group_args(spec)
        argv += load_format(spec, model_path)
        argv += self.lora_args(spec)
        return argv + list(spec.args)

    def lora_args(self, spec: ShardSpec) -> list[str]:
        """Each adapter served under its name: a request whose ``model`` names it gets it."""
        if not spec.adapters:
            return []
        modules = [f"{a.name}={fetched_path(a)}" for a in spec.adapters]
        return ["--enable-lora", "--lora-modules", *modules]

    def lora_path(self, fetched: Path) -> str:
        """vLLM loads a PEFT adapter from its directory (adapter_config.json and the
        weights beside it)."""
        if not (fetched / "adapter_config.json").is_file():
            raise EngineError(
                f"vLLM loads a LoRA adapter from a directory holding adapter_config.json; "
                f"{fetched} is not one: give the adapter's repository (hf:ORG/REPO) or "
                "directory as its source"
            )
        return str(fetched)

    def _group_args(self, spec: ShardSpec) -> list[str]:
        """The flags that make this shard one node of a replica spanning nodes; none for
        a whole replica. EngineError for a vLLM too old to do it without Ray."""
        met = rendezvous(self.name, spec)
        if met is None:
            return []
        group, port = met
        if spec.engine_version and below(spec.engine_version, MULTINODE_SINCE):
            since = ".".join(map(str, MULTINODE_SINCE))
            raise EngineError(
                f"vllm {spec.engine_version} cannot run one replica across nodes without "
                f"Ray, which llmgw does not run (--nnodes came in vLLM {since}); use "
                f"`llmgw ctl engines set vllm {since}` or later"
            )
        argv = ["--pipeline-parallel-size", str(group.size)]
        argv += ["--distributed-executor-backend", "mp"]
        argv += ["--nnodes", str(group.size), "--node-rank", str(group.rank)]
        argv += ["--master-addr", group.leader, "--master-port", str(port)]
        if group.rank > 0:
            argv.append("--headless")
        return argv

    def environment(self, spec: ShardSpec) -> dict[str, str]:
        env = super().environment(spec)
        env.update(OFFLINE_ENV)
        # vLLM reports usage to its authors unless told not to; a private cloud does not.
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        return env
