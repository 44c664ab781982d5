"""TensorRT-LLM's OpenAI server (``trtllm-serve``, PyPI ``tensorrt-llm``), on its
PyTorch backend.

``binary`` is the ``trtllm-serve`` entry point of the environment TensorRT-LLM is
installed in. The model is always the directory the agent fetched (safetensors unless
the model allows pickles: the fetcher holds that rule), and the engine runs with the
Hugging Face hub offline, so it never downloads a model or tokenizer by its id past
the node's checks. The tensor-parallel size is the replica's card count, held by the
catalog to the model's KV heads as vLLM's is (``modelkit.sizing``).

trtllm-serve takes no API key: the node's firewall lets only the control planes reach
its port. Its ``/health`` answers 200 once the model is loaded.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.engines.base import EngineAdapter, EngineError
from llmgw.agent.engines.vllm import OFFLINE_ENV
from llmgw.wire.messages import ShardSpec


class TensorRtLlmAdapter(EngineAdapter):
    name = "tensorrt-llm"
    key_env = None

    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        if model_path.endswith(".gguf"):
            raise EngineError(
                "tensorrt-llm serves Hugging Face checkpoints, not GGUF; give the model's "
                "safetensors repository (hf:ORG/REPO), or serve the GGUF with llama.cpp"
            )
        argv = [binary, model_path, "--host", host, "--port", str(spec.port)]
        argv += ["--backend", "pytorch", "--tp_size", str(max(1, len(spec.cards)))]
        return argv + list(spec.args)

    def environment(self, spec: ShardSpec) -> dict[str, str]:
        env = super().environment(spec)
        env.update(OFFLINE_ENV)
        return env

    def version_command(self, binary: str) -> list[str]:
        python = Path(binary).with_name("python")
        return [str(python), "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)"]
