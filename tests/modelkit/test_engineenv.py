"""A profile's engine variables (``modelkit/engineenv.py``): what passes, and every
kind refused naming the variable: the agent's own, loader and interpreter variables,
what llmgw sets itself, an engine's own that name files, and paths out of the
replica's directory."""

from __future__ import annotations

import pytest

from llmgw.modelkit.engineenv import EnvError, check_env, refusal


def test_ordinary_variables_pass() -> None:
    env = {
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "^docker,lo",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        "FREETOKEN_PIN_BUDGET_GB": "48",
        "TRITON_HOME_RELATIVE": "cache/triton",  # relative: inside the replica's directory
        "EMPTY": "",
    }
    assert check_env("vllm", env) == env


@pytest.mark.parametrize(
    ("engine", "name", "value", "words"),
    [
        ("vllm", "LLMGW_ENGINE_HOST", "0.0.0.0", "LLMGW_ENGINE_HOST is the agent's own setting"),
        ("vllm", "llmgw_state_dir", "x", "llmgw_state_dir is the agent's own setting"),
        ("vllm", "LD_PRELOAD", "libx.so", "LD_PRELOAD is set by llmgw or changes which code"),
        ("vllm", "LD_LIBRARY_PATH", "lib", "LD_LIBRARY_PATH is set by llmgw"),
        ("sglang", "PYTHONPATH", "x", "PYTHONPATH is set by llmgw"),
        ("sglang", "PYTHONSTARTUP", "x.py", "PYTHONSTARTUP is set by llmgw"),
        ("llama.cpp", "CUDA_VISIBLE_DEVICES", "0", "CUDA_VISIBLE_DEVICES is set by llmgw"),
        ("vllm", "VLLM_API_KEY", "k", "VLLM_API_KEY is set by llmgw"),
        ("vllm", "HF_HUB_OFFLINE", "0", "HF_HUB_OFFLINE is set by llmgw"),
        ("vllm", "PATH", "/usr/bin", "PATH is set by llmgw"),
        ("freetoken", "FREETOKEN_API_KEY", "k", "FREETOKEN_API_KEY names a file, an address or"),
        ("freetoken", "FREETOKEN_API_LOG_DIR", "logs", "FREETOKEN_API_LOG_DIR names a file"),
        ("freetoken", "FREETOKEN_DAEMON_URL", "h", "FREETOKEN_DAEMON_URL names a file"),
        ("vllm", "NCCL_TOPO_FILE", "/etc/topo.xml", "NCCL_TOPO_FILE=/etc/topo.xml names a path"),
        ("vllm", "X_HOME", "~/x", "names a path outside the replica's directory (~/x)"),
        ("vllm", "X_DIR", "cache/../../x", "names a path outside the replica's directory"),
        ("vllm", "X_CONF", "a:/etc/x", "names a path outside the replica's directory (/etc/x)"),
        ("vllm", "X_URL", "file:x", "names a path outside the replica's directory (file:x)"),
        ("vllm", "2BAD", "x", "'2BAD' is not a variable name"),
        ("vllm", "A-B", "x", "'A-B' is not a variable name"),
        ("vllm", "MULTI", "a\nb", "MULTI: a value is one line"),
    ],
)
def test_refused_naming_the_variable(engine: str, name: str, value: str, words: str) -> None:
    why = refusal(engine, name, value)
    assert why is not None and words in why
    with pytest.raises(EnvError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_env(engine, {"NCCL_DEBUG": "INFO", name: value})


def test_freetoken_variables_are_its_own_only() -> None:
    # Another engine's file-naming variable is harmless to vLLM: it reads none.
    assert refusal("vllm", "FREETOKEN_API_LOG_DIR", "logs") is None


def test_too_many() -> None:
    with pytest.raises(EnvError, match="at most 64 variables, not 65"):
        check_env("vllm", {f"V{i}": "1" for i in range(65)})
