"""The flags llama.cpp's llama-server is never given from a profile, in every spelling
its own parser (common/arg.cpp) accepts."""

from __future__ import annotations

# Every spelling llama.cpp's common/arg.cpp gives a flag that reads or fetches a file,
# writes one, runs a program, listens elsewhere, picks devices or CPUs, or sets what
# llmgw sets itself; checked against `llama-server --help` of the release llmgw pins
# (the draft model's flags gained --spec-draft-* spellings there).
REFUSED = (
    # the model and whatever else it would load or fetch
    *("-m", "--model", "-mu", "--model-url", "-dr", "--docker-repo"),
    *("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hft", "--hf-token"),
    *("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"),
    *("-hfv", "-hfrv", "--hf-repo-v", "-hffv", "--hf-file-v"),
    *("-md", "--model-draft", "--spec-draft-model", "-mv", "--model-vocoder"),
    *("--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled"),
    *("-mm", "--mmproj", "-mmu", "--mmproj-url"),
    *("--models-dir", "--models-preset"),
    # the presets that name a model of their own ("can download weights from the
    # internet", their help says), older spellings included
    *("--embd-gemma-default", "--embd-bge-small-en-default", "--embd-e5-small-en-default"),
    *("--embd-gte-small-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default"),
    *("--fim-qwen-7b-default", "--fim-qwen-7b-spec", "--fim-qwen-14b-spec"),
    *("--fim-qwen-30b-default", "--gpt-oss-20b-default", "--gpt-oss-120b-default"),
    *("--vision-gemma-4b-default", "--vision-gemma-12b-default"),
    # other files read or written, and programs run
    *("--grammar-file", "-jf", "--json-schema-file", "--chat-template-file"),
    *("-f", "--file", "-bf", "--binary-file"),
    *("-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic"),
    *("--slot-save-path", "--log-file", "--log-prompts-dir", "--path"),
    *("--webui-config-file", "--ui-config-file", "--mcp-servers-config"),
    *("--media-path", "--allowed-local-media-path", "--video-ffmpeg-dir"),
    *("--api-key", "--api-key-file", "--ssl-key-file", "--ssl-cert-file"),
    # devices, CPUs, remote backends: the model's and the draft model's
    *("-dev", "--device", "-devd", "--device-draft", "--spec-draft-device"),
    *("-mg", "--main-gpu", "-mmdev", "--mmproj-device"),
    *("-ts", "--tensor-split", "-ot", "--override-tensor", "--rpc"),
    *("-otd", "--override-tensor-draft", "--spec-draft-override-tensor"),
    *("-t", "--threads", "-tb", "--threads-batch"),
    *("-td", "--threads-draft", "--spec-draft-threads"),
    *("-tbd", "--threads-batch-draft", "--spec-draft-threads-batch"),
    *("-C", "--cpu-mask", "-Cr", "--cpu-range", "-Cb", "--cpu-mask-batch"),
    *("-Crb", "--cpu-range-batch"),
    *("-Cd", "--cpu-mask-draft", "--spec-draft-cpu-mask"),
    *("-Crd", "--cpu-range-draft", "--spec-draft-cpu-range"),
    *("-Cbd", "--cpu-mask-batch-draft", "--spec-draft-cpu-mask-batch"),
    # where it listens and what it answers as: the router and the health check rely on
    # it; another process sharing its port could answer in its place
    *("--host", "--port", "--reuse-port", "-a", "--alias", "--api-prefix"),
)

# Set from the catalog's context and slots.
MANAGED = ("-c", "--ctx-size", "-np", "--parallel")
