"""FreeToken's server (``ft serve``, PyPI ``freetoken``): a mixture of experts several
times a card's size served from one card, its experts in host memory.

``binary`` is the ``ft`` entry point of the environment FreeToken is installed in. It
gets the model (the directory of Hugging Face safetensors the agent fetched), the
address, the card and the served name; the key goes in ``FREETOKEN_API_KEY``, never on
the command line. Its one card is ``--gpu 0``, the first (and only) card
``CUDA_VISIBLE_DEVICES`` leaves it (FreeToken counts an index within that list, and a
MIG instance has no ``GPU-`` UUID it would take).

Its ``/health`` answers 200 from the moment its HTTP server is up, with
``{"status": "loading", ...}`` until the weights are in and ``"error"`` when a worker
died: neither is serving. It serves no Prometheus ``/metrics``.

What it needs of a card and a host (compute capability 8.0+, driver 580+, x86-64) is
judged by placement from the node's figures (``modelkit.enginerules``).
"""

from __future__ import annotations

import json

from llmgw.agent.engines.base import EngineAdapter, EngineError
from llmgw.agent.engines.vllm import OFFLINE_ENV
from llmgw.wire.messages import ShardSpec


class FreeTokenAdapter(EngineAdapter):
    name = "freetoken"
    key_env = "FREETOKEN_API_KEY"

    def command(self, binary: str, spec: ShardSpec, model_path: str, host: str) -> list[str]:
        if model_path.endswith(".gguf"):
            raise EngineError(
                "freetoken serves Hugging Face safetensors checkpoints through llmgw; "
                "give the model's safetensors repository (hf:ORG/REPO), or serve the GGUF "
                "with llama.cpp"
            )
        argv = [binary, "serve", "--model-path", model_path]
        argv += ["--host", host, "--port", str(spec.port), "--gpu", "0"]
        if spec.model:
            argv += ["--served-model-name", spec.model]
        return argv + list(spec.args)

    def environment(self, spec: ShardSpec) -> dict[str, str]:
        env = super().environment(spec)
        env.update(OFFLINE_ENV)
        return env

    def ready(self, status: int, body: bytes) -> bool:
        """Not while its health says "loading" or "error", which answer 200 too."""
        if not super().ready(status, body):
            return False
        try:
            said = json.loads(body)
        except ValueError:
            return True
        return not (isinstance(said, dict) and said.get("status") in ("loading", "error"))

    def parse_version(self, output: str) -> str | None:
        """``freetoken version 0.2.1``: the last word of the last line."""
        lines = [line.split() for line in output.splitlines() if line.strip()]
        return lines[-1][-1] if lines else None
