"""vLLM's OpenAI server (``vllm serve``): command line, key in VLLM_API_KEY, and the
flags refused as its argparse parser reads them, beginnings of long options included.

``binary`` is the ``vllm`` entry point of the environment vLLM is installed in. The
model is always a local path the agent fetched; the engine runs with the Hugging Face
hub offline, so nothing it is given can make it fetch.

``--hf-overrides`` is allowed: it is JSON that changes the model's config in memory,
reads no file, and with ``--trust-remote-code`` refused cannot bring in code.
"""

from __future__ import annotations

from llmgw.agent.engines.base import EngineAdapter
from llmgw.wire.messages import ShardSpec

# Engines fetch nothing: the agent fetched the model, and the hub stays shut.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def load_format(spec: ShardSpec, model_path: str) -> list[str]:
    """``--load-format safetensors`` unless the model may load pickles, so a directory
    holding only ``.bin`` files fails to load rather than unpickling them. A GGUF file
    is read as GGUF by its name."""
    if spec.allow_pickle or model_path.endswith(".gguf"):
        return []
    return ["--load-format", "safetensors"]


class VllmAdapter(EngineAdapter):
    name = "vllm"
    key_env = "VLLM_API_KEY"

    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        argv = [binary, "serve", model_path, "--host", host, "--port", str(spec.port)]
        if spec.model:
            argv += ["--served-model-name", spec.model]
        argv += ["--tensor-parallel-size", str(max(1, len(spec.cards)))]
        argv += load_format(spec, model_path)
        return argv + list(spec.args)

    def environment(self, spec: ShardSpec) -> dict[str, str]:
        env = super().environment(spec)
        env.update(OFFLINE_ENV)
        # vLLM reports usage to its authors unless told not to; a private cloud does not.
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        return env
