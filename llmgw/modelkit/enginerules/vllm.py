"""vLLM's flags: those refused from a profile and the rest of what `vllm serve` takes,
so a beginning of a long option is judged as its argparse parser judges it."""

from __future__ import annotations

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
    # nodes: a replica spanning nodes is given these by llmgw (vLLM 0.11.1's -n and -r
    # are short for --nnodes and --node-rank; no other vLLM option begins -n or -r)
    *("--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port"),
    *("--distributed-executor-backend", "--headless"),
)

# What `vllm serve --help` lists besides the refused flags (0.8 to 0.11), so that a
# beginning is judged unique or ambiguous as vLLM judges it.
OPTIONS = (
    *("--help", "-h", "--api-server-count", "-asc", "--uvicorn-log-level"),
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
    *("--data-parallel-rank", "-dpn"),
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

# Set from the catalog's context and slots.
MANAGED = ("--max-model-len", "--max-num-seqs")
