"""TensorRT-LLM's flags (``trtllm-serve``, 0.20 to 1.x): those refused from a profile,
in every spelling its click parser takes.

click looks an option up exactly (no beginnings), by the names each option declares;
trtllm-serve declares them with underscores (``--tp_size``). A refused flag is listed
here with dashes, and ``ExactFlags`` reads an argument's underscores as dashes, so
``--tp_size`` and ``--tp-size`` are both refused (the second is no option of
trtllm-serve at all, which would stop with an error).

trtllm-serve takes no API key: its replicas are reached only through the node's
firewall (``agent/firewall.py``), which lets only the control planes reach the
engines' ports.
"""

from __future__ import annotations

REFUSED = (
    # the model, and what else it would read, fetch or import
    *("--tokenizer", "--custom-tokenizer", "--trust-remote-code", "--revision"),
    *("--config", "--extra-llm-api-options", "--custom-module-dirs", "--chat-template"),
    *("--metadata-server-config-file", "--disagg-cluster-uri", "--server-role"),
    *("--media-io-kwargs", "--backend"),
    # where it listens
    *("--host", "--port"),
    # devices and nodes: placement gives the cards, their count is the tp size
    *("--tensor-parallel-size", "--tp-size", "--pipeline-parallel-size", "--pp-size"),
    *("--context-parallel-size", "--cp-size", "--gpus-per-node"),
)

# Set from the catalog's context and slots.
MANAGED = ("--max-seq-len", "--max-batch-size")
