"""SGLang's flags: those refused from a profile and the rest of what its server takes,
so a beginning of a long option is judged as its argparse parser judges it."""

from __future__ import annotations

REFUSED = (
    # the model, and what else it would read, fetch, write or delete
    *("--model-path", "--model", "--tokenizer-path", "--trust-remote-code"),
    *("--download-dir", "--load-format", "--config", "--chat-template"),
    *("--completion-template", "--lora-paths", "--speculative-draft-model-path"),
    *("--speculative-token-map", "--quantization-param-path", "--init-expert-location"),
    *("--ds-channel-config-path", "--deepep-config", "--custom-weight-loader"),
    *("--file-storage-path", "--crash-dump-folder", "--delete-ckpt-after-loading"),
    *("--debug-tensor-dump-output-folder", "--debug-tensor-dump-input-file", "--tool-server"),
    *("--ssl-keyfile", "--ssl-certfile"),
    # where it listens and what it answers as
    *("--host", "--port", "--api-key", "--served-model-name"),
    # devices and nodes: placement gives the cards, their count is the tp size
    *("--device", "--tensor-parallel-size", "--tp-size", "--pipeline-parallel-size"),
    *("--pp-size", "--data-parallel-size", "--dp-size", "--base-gpu-id", "--gpu-id-step"),
    *("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"),
    "--disaggregation-ib-device",
)

# What SGLang's ServerArgs.add_cli_args lists besides the refused flags (0.4 to 0.5).
OPTIONS = (
    *("--help", "-h", "--tokenizer-mode", "--tokenizer-worker-num", "--skip-tokenizer-init"),
    *("--model-loader-extra-config", "--context-length", "--is-embedding"),
    *("--enable-multimodal", "--revision", "--model-impl", "--skip-server-warmup"),
    *("--warmups", "--nccl-port", "--dtype", "--quantization", "--kv-cache-dtype"),
    *("--mem-fraction-static", "--max-running-requests", "--max-queued-requests"),
    *("--max-total-tokens", "--chunked-prefill-size", "--max-prefill-tokens"),
    *("--schedule-policy", "--schedule-conservativeness", "--page-size"),
    *("--hybrid-kvcache-ratio", "--swa-full-tokens-ratio", "--disable-hybrid-swa-memory"),
    *("--max-micro-batch-size", "--stream-interval", "--stream-output", "--random-seed"),
    *("--constrained-json-whitespace-pattern", "--watchdog-timeout", "--dist-timeout"),
    *("--sleep-on-idle", "--log-level", "--log-level-http", "--log-requests"),
    *("--log-requests-level", "--show-time-cost", "--enable-metrics"),
    *("--enable-metrics-for-all-schedulers", "--bucket-time-to-first-token"),
    *("--bucket-inter-token-latency", "--bucket-e2e-request-latency"),
    *("--collect-tokens-histogram", "--decode-log-interval", "--kv-events-config"),
    *("--enable-request-time-stats-logging", "--enable-trace", "--otlp-traces-endpoint"),
    *("--weight-version", "--enable-cache-report", "--reasoning-parser", "--tool-call-parser"),
    *("--load-balance-method", "--json-model-override-args", "--preferred-sampling-params"),
    *("--enable-lora", "--max-lora-rank", "--lora-target-modules", "--max-loras-per-batch"),
    *("--max-loaded-loras", "--lora-backend", "--attention-backend", "--sampling-backend"),
    *("--prefill-attention-backend", "--decode-attention-backend", "--grammar-backend"),
    *("--mm-attention-backend", "--speculative-algorithm", "--speculative-num-steps"),
    *("--speculative-draft-model-revision", "--speculative-eagle-topk"),
    *("--speculative-num-draft-tokens", "--speculative-accept-threshold-single"),
    *("--speculative-accept-threshold-acc", "--expert-parallel-size", "--ep-size", "--ep"),
    *("--moe-a2a-backend", "--moe-runner-backend", "--deepep-mode"),
    *("--ep-num-redundant-experts", "--ep-dispatch-algorithm", "--enable-eplb"),
    *("--eplb-algorithm", "--eplb-rebalance-num-iterations", "--enable-hierarchical-cache"),
    *("--hicache-ratio", "--hicache-size", "--hicache-write-policy", "--enable-double-sparsity"),
    *("--cpu-offload-gb", "--offload-group-size", "--disable-radix-cache"),
    *("--cuda-graph-max-bs", "--cuda-graph-bs", "--disable-cuda-graph"),
    *("--disable-cuda-graph-padding", "--enable-profile-cuda-graph", "--enable-nccl-nvls"),
    *("--disable-outlines-disk-cache", "--disable-custom-all-reduce", "--enable-mscclpp"),
    *("--disable-overlap-schedule", "--enable-mixed-chunk", "--enable-dp-attention"),
    *("--enable-dp-lm-head", "--enable-two-batch-overlap", "--enable-torch-compile"),
    *("--torch-compile-max-bs", "--torchao-config", "--enable-nan-detection"),
    *("--enable-p2p-check", "--triton-attention-reduce-in-fp32", "--enable-memory-saver"),
    *("--triton-attention-num-kv-splits", "--num-continuous-decode-steps"),
    *("--allow-auto-truncate", "--enable-custom-logit-processor", "--disaggregation-mode"),
    *("--disaggregation-transfer-backend", "--disaggregation-bootstrap-port"),
    *("--enable-return-hidden-states", "--weight-loader-disable-mmap"),
)

# Set from the catalog's context and slots.
MANAGED = ("--context-length", "--max-running-requests")
