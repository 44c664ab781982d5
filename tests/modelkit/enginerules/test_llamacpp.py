"""llama.cpp's rules (``modelkit/enginerules/llamacpp.py``): every spelling of a flag
llama-server must not be given from a profile is refused as its own parser reads it
(exactly, ``_`` for ``-`` in long flags, ``--flag=value``), the flags the catalog sets
point at ``ctl model context``, and neighbouring harmless flags pass."""

from __future__ import annotations

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


@pytest.mark.xfail(
    strict=True,
    reason="REFUSED misses llama-server flags that fetch weights from the internet: the "
    "--*-default presets (their help says 'can download weights from the internet') and "
    "-dr/--docker-repo (Docker Hub); a profile's argument then runs another model than "
    "the catalog's, fetched by the engine, unchecked (the llama.cpp adapter sets no "
    "offline mode)",
)
@pytest.mark.parametrize(
    "flag",
    [
        "--fim-qwen-7b-default",
        "--embd-bge-small-en-default",
        "--fim-qwen-7b-spec",
        "-dr",
        "--docker-repo",
    ],
)
def test_flags_that_fetch_weights_are_refused(flag: str) -> None:
    assert LLAMA.refused_flag([flag]) == flag


@pytest.mark.xfail(
    strict=True,
    reason="REFUSED refuses -ot/--override-tensor and -devd/--device-draft but not "
    "-otd/--override-tensor-draft (buffer types, i.e. devices, for the draft model), nor "
    "--allowed-local-media-path (lets requests read files under a path of the node)",
)
@pytest.mark.parametrize(
    "args",
    [
        ["-otd", "exps=CPU"],
        ["--override-tensor-draft", "exps=CPU"],
        ["--allowed-local-media-path", "/"],
    ],
)
def test_draft_devices_and_local_media_paths_are_refused(args: list[str]) -> None:
    assert LLAMA.refused_flag(args) == args[0]
