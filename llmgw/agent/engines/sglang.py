"""SGLang's server (``python -m sglang.launch_server``): command line with the key as
``--api-key`` (SGLang reads it from nowhere else), metrics turned on, and the flags
refused as its argparse parser reads them, beginnings of long options included.

``binary`` is the Python interpreter of the environment SGLang is installed in.

A replica spanning nodes (``spec.group``) runs the same command on every node, only
``--node-rank`` differing: the tensor-parallel size is every card of the replica
(this node's count times the number of nodes) and the nodes meet at
``--dist-init-addr LEADER:RENDEZVOUS_PORT``. Rank 0 serves the API; ranks 1.. serve
only ``GET /health`` (and ``/health_generate``) from a stand-in server on their
``--host``/``--port``, so they are probed over HTTP like a leader.

SGLang takes more than the rendezvous port on the leader: with
``--enable-dp-attention`` its ZMQ channels between the nodes use the ports after it,
rendezvous port +1 to +5 (and one more each data-parallel rank), on the leader's
address (0.5.3 ``PortArgs.init_new``). The control plane must leave those free on the
leader and reachable from the other members; NCCL's own connections take ports of
its choosing besides.
"""

from __future__ import annotations

from llmgw.agent.engines.base import EngineAdapter, EngineError
from llmgw.agent.engines.vllm import OFFLINE_ENV, below, load_format, rendezvous
from llmgw.wire.messages import ShardSpec

# SGLang before 0.5.5 sets NCCL_CUMEM_ENABLE=0 itself unless --enable-symm-mem, which
# turns off the cuMem that NCCL's multi-node NVLink needs (``_set_envs_and_config``).
MNNVL_FROM = (0, 5, 5)


def dist_init_addr(host: str, port: int) -> str:
    """``HOST:PORT`` as SGLang reads ``--dist-init-addr``: an IPv6 address in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class SglangAdapter(EngineAdapter):
    name = "sglang"
    key_env = None
    collective = True
    images = "config"

    def check(self, spec: ShardSpec) -> None:
        super().check(spec)
        rendezvous(self.name, spec)
        version = spec.engine_version
        if spec.group is not None and spec.group.nvlink and version and below(version, MNNVL_FROM):
            raise EngineError(
                f"sglang {version} turns off the NCCL cuMem that NVLink between the trays "
                "needs (NCCL_CUMEM_ENABLE=0); run 0.5.5 or later: "
                "`llmgw ctl engines set sglang 0.5.5`"
            )

    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        argv = [binary, "-m", "sglang.launch_server", "--model-path", model_path]
        argv += ["--host", host, "--port", str(spec.port)]
        if spec.model:
            argv += ["--served-model-name", spec.model]
        met = rendezvous(self.name, spec)
        nodes = met[0].size if met is not None else 1
        argv += ["--tp-size", str(max(1, len(spec.cards)) * nodes)]
        if met is not None:
            group, port = met
            argv += ["--nnodes", str(group.size), "--node-rank", str(group.rank)]
            argv += ["--dist-init-addr", dist_init_addr(group.leader, port)]
        argv += load_format(spec, model_path)
        if spec.key:
            argv += ["--api-key", spec.key]
        argv.append("--enable-metrics")
        return argv + list(spec.args)

    def environment(self, spec: ShardSpec) -> dict[str, str]:
        env = super().environment(spec)
        env.update(OFFLINE_ENV)
        return env

    def version_command(self, binary: str) -> list[str]:
        return [binary, "-c", "import sglang; print(sglang.__version__)"]
