"""FreeToken's flags (``ft serve``, 0.2): those refused from a profile and the rest of
what its argparse parser takes, so a beginning of a long option is judged as FreeToken
judges it; and the ``FREETOKEN_`` variables a profile's environment may not set.

FreeToken keeps a mixture of experts' experts in host memory and the ones used most on
its one card: it needs compute capability 8.0 or more (0.2.1 had no kernel image for a
7.5 card's first prefill, and in fp16 hit an illegal memory access on its first
request), an NVIDIA driver of 580 or later (the CUDA 13 toolkit it compiles kernels
with), and an x86-64 host (its wheels).
"""

from __future__ import annotations

REFUSED = (
    # the model, and what else it would read or fetch
    *("--model-path", "--model", "--model-source", "--mmproj"),
    *("--allowed-local-media-path", "--allowed-media-domains", "--moe-cache-split"),
    # where it listens and what it answers as (the key is in FREETOKEN_API_KEY)
    *("--host", "--port", "--api-key", "--served-model-name", "--shell-mode"),
    # devices: placement gives the card
    *("--gpu", "--tensor-parallel-size", "--tp-size"),
)

# What ``ft serve --help`` lists besides the refused flags (0.2.1).
OPTIONS = (
    *("--help", "-h", "--dtype", "--hf-overrides", "--max-output-tokens", "--memory-ratio"),
    *("--dummy-weight", "--disable-pynccl", "--cuda-graph-max-bs", "--graph"),
    *("--num-tokenizer", "--tokenizer-count", "--max-prefill-length", "--max-extend-length"),
    *("--decode-log-interval", "--num-pages", "--num-tokens", "--page-size"),
    *("--attention-backend", "--attn", "--cache-type", "--text-model-only", "--mm-disable"),
    *("--image-min-tokens", "--image-max-tokens", "--mm-processor-kwargs"),
    *("--mm-embed-cache-device", "--mm-encoder-weights", "--enable-cache-report"),
    *("--anthropic-inline-system", "--sampling-defaults", "--tool-call-parser"),
    *("--reasoning-parser", "--moe-strategy", "--moe-backend", "--quant-backend"),
    *("--ple-backend", "--embed-weights", "--swa-decoder-replay", "--nvfp4-backend"),
    *("--expert-load", "--moe-cache-size", "--moe-cache-rate", "--moe-cache-mem"),
    *("--moe-cache-auto", "--kv-reserve-tokens", "--moe-cache-scope", "--moe-cache-policy"),
    *("--moe-cpu-threads", "--moe-cpu-layers", "--moe-hybrid-max-fetch", "--moe-locked-fetch"),
    *("--moe-locked-max-fetch", "--disable-moe-prefill-overlap", "--enable-special-token-ckpt"),
    *("--moe-collect-stats", "--moe-prefill-hit-d2d", "--cors-origins"),
)

# ``--moe-cache-split equal`` reads nothing; ``profile:PATH`` reads a file.
ALLOWED_VALUES = {"--moe-cache-split": ("equal",)}

# Set from the catalog's context and slots.
MANAGED = ("--max-seq-len-override", "--max-running-requests")

# FREETOKEN_ variables a profile may not set: those naming a file or directory, the
# daemon's address and token, and what llmgw sets itself (the key).
REFUSED_ENV = (
    *("FREETOKEN_API_KEY", "FREETOKEN_HOST", "FREETOKEN_DAEMON_URL", "FREETOKEN_DAEMON_TOKEN"),
    *("FREETOKEN_DAEMON_DIR", "FREETOKEN_API_LOG_DIR", "FREETOKEN_MMPROJ"),
    *("FREETOKEN_BENCHBW_PATH", "FREETOKEN_MOE_CONFIG_DIR", "FREETOKEN_KERNEL_CACHE_DIR"),
)

MIN_COMPUTE = (8, 0)
MIN_DRIVER = 580
ARCHES = ("x86_64",)
