"""llama.cpp's rules (``modelkit/enginerules/llamacpp.py``): every spelling of a flag
llama-server must not be given from a profile is refused as its own parser reads it
(exactly, ``_`` for ``-`` in long flags, ``--flag=value``), the flags the catalog sets
point at ``ctl model context``, and neighbouring harmless flags pass."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from llmgw.modelkit.enginerules import RuleError, rules
from llmgw.modelkit.enginerules.llamacpp import MANAGED, REFUSED

LLAMA = rules("llama.cpp")


def test_the_lists_are_flags_each_named_once_and_apart() -> None:
    for flags in (REFUSED, MANAGED):
        assert len(set(flags)) == len(flags)
        assert all(f.startswith("-") and f.strip() == f and " " not in f for f in flags)
    assert not set(REFUSED) & set(MANAGED)


@pytest.mark.parametrize("flag", REFUSED)
def test_every_refused_spelling_is_refused(flag: str) -> None:
    assert LLAMA.refused_flag(["--jinja", flag, "value"]) == flag
    assert LLAMA.refused_flag([f"{flag}=value"]) == f"{flag}=value"
    if flag.startswith("--"):
        underscored = "--" + flag[2:].replace("-", "_")
        assert LLAMA.refused_flag([underscored, "value"]) == underscored
    with pytest.raises(RuleError, match="llmgw chooses the model file, devices and paths"):
        LLAMA.check([flag, "value"], cards=1)


@pytest.mark.parametrize("flag", MANAGED)
def test_the_catalogs_flags_point_at_ctl_model_context(flag: str) -> None:
    assert LLAMA.refused_flag([flag, "4096"]) is None
    with pytest.raises(RuleError, match="llmgw ctl model context") as refused:
        LLAMA.check([flag, "4096"], cards=1)
    assert repr(flag) in str(refused.value)


@pytest.mark.parametrize(
    "args",
    [
        # Its parser looks flags up exactly: these are flags of their own.
        ["--chat-template", "chatml"],
        ["--lora-init-without-apply"],
        ["--no-mmproj"],
        ["--threads-http", "4"],
        ["--ctx-size-draft", "2048"],
        ["--no-webui", "--metrics", "--jinja", "-fa", "on", "-ngl", "99"],
        # A value that names a refused flag, without its dashes, is a value.
        ["--reverse-prompt", "model"],
    ],
)
def test_neighbouring_flags_pass(args: list[str]) -> None:
    assert LLAMA.refused_flag(args) is None
    LLAMA.check(args, cards=4)


def test_the_catalog_gives_context_per_slot() -> None:
    assert LLAMA.context_args(4096, 3) == ["--ctx-size", "12288", "--parallel", "3"]
    assert set(LLAMA.context_args(4096, 3)) & set(MANAGED) == {"--ctx-size", "--parallel"}


@pytest.mark.parametrize(
    "flag",
    [
        "--fim-qwen-7b-default",
        "--embd-bge-small-en-default",
        "--fim-qwen-7b-spec",
        "--gpt-oss-20b-default",
        "-dr",
        "--docker-repo",
        "--spec-draft-model",
        "--spec-draft-hf",
    ],
)
def test_flags_that_fetch_weights_are_refused(flag: str) -> None:
    assert LLAMA.refused_flag([flag]) == flag


@pytest.mark.parametrize(
    "args",
    [
        ["-otd", "exps=CPU"],
        ["--override-tensor-draft", "exps=CPU"],
        ["--spec-draft-override-tensor", "exps=CPU"],
        ["--spec-draft-device", "CUDA1"],
        ["-mmdev", "CUDA1"],
        ["-td", "64"],
        ["--spec-draft-cpu-mask", "ff"],
        ["--allowed-local-media-path", "/"],
        ["--media-path", "/"],
        ["--video-ffmpeg-dir", "/tmp/evil"],
        ["--log-prompts-dir", "/var/lib"],
        ["--reuse-port"],
    ],
)
def test_draft_devices_and_local_media_paths_are_refused(args: list[str]) -> None:
    assert LLAMA.refused_flag(args) == args[0]


# What an option of llama-server's own --help takes, or says, that makes it one llmgw
# sets itself or refuses: a file, folder or device, a download, another place to listen.
TAKES = re.compile(r"\b(FNAME|PATH|DIR|FILE)\b|<dev|download weights|\bDEVICE\b")
# Options that take a file or device and are still the profile's to give: none reads or
# writes outside what llmgw hands the engine.
FREE = {"--chat-template", "--mmproj-auto", "--no-mmproj", "--list-devices"}


def test_every_option_of_the_pinned_llama_server_that_takes_a_file_or_device_is_refused(
    binary: Path,
) -> None:
    help_text = subprocess.run(
        [str(binary), "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "--model" in help_text, help_text[:500]
    caught = []
    for line in help_text.splitlines():
        if not line.startswith("-"):
            continue
        head, _, said = line.partition("  ")
        words = head + " " + said
        # The description may go on beneath: "download weights" is said on the first line.
        if not TAKES.search(words):
            continue
        for spelling in re.findall(r"(?:^|[ ,])(--?[A-Za-z][\w.-]*)", head):
            if spelling not in REFUSED and spelling not in FREE:
                caught.append(spelling)
    assert caught == [], f"llama-server options llmgw does not refuse: {caught}"
