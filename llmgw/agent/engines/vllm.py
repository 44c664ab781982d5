"""vLLM's OpenAI server (``vllm serve``): command line, key in VLLM_API_KEY, and the
flags refused as its argparse parser reads them, beginnings of long options included.

``binary`` is the ``vllm`` entry point of the environment vLLM is installed in. The
model is always a local path the agent fetched; the engine runs with the Hugging Face
hub offline, so nothing it is given can make it fetch.

``--hf-overrides`` is allowed: it is JSON that changes the model's config in memory,
reads no file, and with ``--trust-remote-code`` refused cannot bring in code.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.agent.engines.base import EngineAdapter
from llmgw.agent.engines.flags import ArgparseFlags
from llmgw.wire.messages import ShardSpec

REFUSED = (
    # the model, and what else it would read, fetch or import
    *("--model", "--tokenizer", "--trust-remote-code", "--download-dir"),
    *("--load-format", "--hf-token", "--hf-config-path", "--config"),
    *("--generation-config", "--chat-template", "--lora-modules", "--speculative-config"),
    *("--allowed-local-media-path", "--tool-parser-plugin", "--middleware"),
    *("--worker-cls", "--worker-extension-cls", "--scheduler-cls", "--logits-processors"),
    *("--log-config-file", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs"),
    # where it listens and what it answers as
    *("--host", "--port", "--uds", "--api-key", "--served-model-name"),
    # devices: placement gives the cards, and their count is the tensor-parallel size
    *("--device", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp"),
    *("--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl"),
)

# What `vllm serve --help` lists besides the refused flags (0.8 to 0.11), so that a
# beginning is judged unique or ambiguous as vLLM judges it.
OPTIONS = (
    *("--help", "-h", "--headless", "--api-server-count", "-asc", "--uvicorn-log-level"),
    *("--disable-uvicorn-access-log", "--allow-credentials", "--allowed-origins"),
    *("--allowed-methods", "--allowed-headers", "--chat-template-content-format"),
    *("--response-role", "--enable-ssl-refresh", "--ssl-cert-reqs", "--root-path"),
    *("--return-tokens-as-token-ids", "--disable-frontend-multiprocessing"),
    *("--enable-request-id-headers", "--enable-auto-tool-choice", "--tool-call-parser"),
    *("--max-log-len", "--disable-fastapi-docs", "--enable-prompt-tokens-details"),
    *("--enable-server-load-tracking", "--enable-force-include-usage", "--task"),
    *("--enable-tokenizer-info-endpoint", "--disable-log-stats", "--disable-log-requests"),
    *("--enable-log-requests", "--runner", "--convert", "--tokenizer-mode", "--dtype"),
    *("--seed", "--revision", "--code-revision", "--rope-scaling", "--rope-theta"),
    *("--tokenizer-revision", "--max-model-len", "--quantization", "-q"),
    *("--enforce-eager", "--max-seq-len-to-capture", "--max-logprobs", "--logprobs-mode"),
    *("--disable-sliding-window", "--disable-cascade-attn", "--skip-tokenizer-init"),
    *("--enable-prompt-embeds", "--disable-async-output-proc", "--config-format"),
    *("--hf-overrides", "--pooler-config", "--override-pooler-config"),
    *("--logits-processor-pattern", "--override-generation-config", "--enable-sleep-mode"),
    *("--model-impl", "--override-attention-dtype", "--model-loader-extra-config"),
    *("--ignore-patterns", "--use-tqdm-on-load", "--pt-load-map-location"),
    *("--guided-decoding-backend", "--reasoning-parser", "--structured-outputs-config"),
    *("--distributed-executor-backend", "--data-parallel-rank", "-dpn"),
    *("--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp"),
    *("--data-parallel-backend", "-dpb", "--data-parallel-hybrid-lb", "--data-parallel-start-rank"),
    *("--enable-expert-parallel", "--enable-eplb", "--eplb-config", "--num-redundant-experts"),
    *("--max-parallel-loading-workers", "--disable-custom-all-reduce", "--block-size"),
    *("--gpu-memory-utilization", "--swap-space", "--kv-cache-dtype", "--num-gpu-blocks-override"),
    *("--enable-prefix-caching", "--no-enable-prefix-caching", "--prefix-caching-hash-algo"),
    *("--cpu-offload-gb", "--calculate-kv-scales", "--kv-sharing-fast-prefill"),
    *("--mamba-cache-dtype", "--limit-mm-per-prompt", "--media-io-kwargs"),
    *("--mm-processor-kwargs", "--mm-processor-cache-gb", "--disable-mm-preprocessor-cache"),
    *("--enable-lora", "--enable-lora-bias", "--max-loras", "--max-lora-rank"),
    *("--lora-extra-vocab-size", "--lora-dtype", "--max-cpu-loras", "--fully-sharded-loras"),
    *("--default-mm-loras", "--otlp-traces-endpoint", "--collect-detailed-traces"),
    *("--max-num-batched-tokens", "--max-num-seqs", "--max-num-partial-prefills"),
    *("--max-long-partial-prefills", "--cuda-graph-sizes", "--long-prefill-token-threshold"),
    *("--num-lookahead-slots", "--scheduling-policy", "--enable-chunked-prefill"),
    *("--disable-chunked-mm-input", "--disable-hybrid-kv-cache-manager", "--async-scheduling"),
    *("--kv-transfer-config", "--kv-events-config", "--compilation-config", "-O"),
    *("--additional-config", "--show-hidden-metrics-for-version", "--preemption-mode"),
)

# `--generation-config auto|vllm` chooses defaults and reads nothing; a path reads a file.
ALLOWED_VALUES = {"--generation-config": ("auto", "vllm")}

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
    flags = ArgparseFlags(OPTIONS, REFUSED, ALLOWED_VALUES)

    def refused_flag(self, args: Sequence[str]) -> str | None:
        return self.flags.refused_flag(args)

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
