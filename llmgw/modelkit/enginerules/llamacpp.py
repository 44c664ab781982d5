"""The flags llama.cpp's llama-server is never given from a profile, in every spelling
its own parser (common/arg.cpp) accepts."""

from __future__ import annotations

# Every spelling llama.cpp's common/arg.cpp gives a flag that reads or fetches a file,
# writes one, listens elsewhere, picks devices or CPUs, or sets what llmgw sets itself.
REFUSED = (
    # the model and whatever else it would load or fetch
    *("-m", "--model", "-mu", "--model-url"),
    *("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hft", "--hf-token"),
    *("-hfd", "-hfrd", "--hf-repo-draft", "-hfv", "-hfrv", "--hf-repo-v"),
    *("-hffv", "--hf-file-v", "-md", "--model-draft", "-mv", "--model-vocoder"),
    *("--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled"),
    *("-mm", "--mmproj", "-mmu", "--mmproj-url"),
    *("--models-dir", "--models-preset"),
    # other files read or written
    *("--grammar-file", "-jf", "--json-schema-file", "--chat-template-file"),
    *("-f", "--file", "-bf", "--binary-file"),
    *("-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic"),
    *("--slot-save-path", "--log-file", "--path", "--webui-config-file"),
    *("--api-key", "--api-key-file", "--ssl-key-file", "--ssl-cert-file"),
    # devices, CPUs, remote backends
    *("-dev", "--device", "-devd", "--device-draft", "-mg", "--main-gpu"),
    *("-ts", "--tensor-split", "-ot", "--override-tensor", "--rpc"),
    *("-t", "--threads", "-tb", "--threads-batch"),
    *("-C", "--cpu-mask", "-Cr", "--cpu-range", "-Cb", "--cpu-mask-batch"),
    *("-Crb", "--cpu-range-batch"),
    # where it listens and what it answers as: the router and the health check rely on it
    *("--host", "--port", "-a", "--alias", "--api-prefix"),
)

# Set from the catalog's context and slots.
MANAGED = ("-c", "--ctx-size", "-np", "--parallel")
