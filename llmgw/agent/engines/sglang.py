"""SGLang's server (``python -m sglang.launch_server``): command line with the key as
``--api-key`` (SGLang reads it from nowhere else), metrics turned on, and the flags
refused as its argparse parser reads them, beginnings of long options included.

``binary`` is the Python interpreter of the environment SGLang is installed in.
"""

from __future__ import annotations

from llmgw.agent.engines.base import EngineAdapter
from llmgw.agent.engines.vllm import OFFLINE_ENV, load_format
from llmgw.wire.messages import ShardSpec


class SglangAdapter(EngineAdapter):
    name = "sglang"
    key_env = None

    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        argv = [binary, "-m", "sglang.launch_server", "--model-path", model_path]
        argv += ["--host", host, "--port", str(spec.port)]
        if spec.model:
            argv += ["--served-model-name", spec.model]
        argv += ["--tp-size", str(max(1, len(spec.cards)))]
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
