"""The fleet's wanted engines as operators write them: versions normalised, and every
refusal naming the engine and what is wrong with it."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.enginepins import (
    LLAMACPP_PIN,
    PINNED,
    PinError,
    check_build,
    check_engine,
    normalise_version,
    parse_want,
    parse_wanted,
    pinned,
    want_of,
)

HEX = "ab" * 32


def test_llamacpp_numbers_become_tags_and_others_stay_as_given() -> None:
    assert normalise_version("llama.cpp", "6000") == "b6000"
    assert normalise_version("llama.cpp", " b6000 ") == "b6000"
    assert normalise_version("vllm", "0.11.0") == "0.11.0"
    assert normalise_version("sglang", "0.5.3.post1") == "0.5.3.post1"
    # Only llama.cpp's releases are numbered tags: a bare number is another engine's own.
    assert normalise_version("vllm", "11") == "11"


def test_a_version_alone_a_number_or_a_map_read_as_one_shape() -> None:
    expected: dict[str, Any] = {"version": "b6000", "sha256": {}, "index_url": None}
    assert parse_want("llama.cpp", "b6000") == expected
    assert parse_want("llama.cpp", 6000) == expected
    assert parse_want("llama.cpp", "6000") == expected
    assert parse_want("llama.cpp", {"version": 6000}) == expected
    asset = "llama-b6000-bin-ubuntu-x64.tar.gz"
    assert parse_want("llama.cpp", {"version": "b6000", "sha256": {asset: HEX.upper()}}) == {
        "version": "b6000",
        "sha256": {asset: HEX},  # digests kept lower case
        "index_url": None,
    }
    assert parse_want(
        "vllm", {"version": "0.11.0", "index_url": "https://pypi.example/simple"}
    ) == {
        "version": "0.11.0",
        "sha256": {},
        "index_url": "https://pypi.example/simple",
    }
    assert parse_want("sglang", {"version": "0.5.3", "index_url": "http://mirror:8080/simple"})[
        "index_url"
    ] == ("http://mirror:8080/simple")


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        (
            "tgi",
            "1.0",
            r"^'tgi' is not an engine llmgw runs "
            r"\(it runs llama.cpp, vllm, sglang, freetoken, tensorrt-llm\)",
        ),
        ("llama.cpp", "b 6000", r"^llama.cpp: 'b 6000' is not a version"),
        ("llama.cpp", "", r"^llama.cpp: '' is not a version"),
        ("vllm", "-rc1", r"^vllm: '-rc1' is not a version"),
        ("vllm", "1" * 65, r"^vllm: '1{65}' is not a version"),
        ("llama.cpp", True, r"^llama.cpp: give a version or a map"),
        ("llama.cpp", ["b6000"], r"^llama.cpp: give a version or a map"),
        ("llama.cpp", {}, r"^llama.cpp: version is missing"),
        ("llama.cpp", {"version": None}, r"^llama.cpp: version is missing"),
        ("llama.cpp", {"version": True}, r"^llama.cpp: version is missing"),
        ("llama.cpp", {"version": "b1", "sha256": "abc"}, r"^llama.cpp: sha256 maps each"),
        (
            "llama.cpp",
            {"version": "b1", "sha256": {"a.tar.gz": "abc"}},
            r"^llama.cpp: the sha256 of a.tar.gz must be 64 hex digits",
        ),
        (
            "llama.cpp",
            {"version": "b1", "sha256": {"a.tar.gz": "g" * 64}},
            r"^llama.cpp: the sha256 of a.tar.gz must be 64 hex digits",
        ),
        (
            "llama.cpp",
            {"version": "b1", "sha256": {"a.tar.gz": HEX + "0"}},
            r"^llama.cpp: the sha256 of a.tar.gz must be 64 hex digits",
        ),
        (
            "llama.cpp",
            {"version": "b1", "sha256": {"a.tar.gz": 123}},
            r"^llama.cpp: the sha256 of a.tar.gz must be 64 hex digits",
        ),
        (
            "llama.cpp",
            {"version": "b1", "sha256": {"../a.tar.gz": HEX}},
            r"^llama.cpp: '../a.tar.gz' is not a release archive's file name",
        ),
        (
            "llama.cpp",
            {"version": "b1", "sha256": {"dir/a.tar.gz": HEX}},
            r"^llama.cpp: 'dir/a.tar.gz' is not a release archive's file name",
        ),
        (
            "llama.cpp",
            {"version": "b1", "sha256": {"": HEX}},
            r"^llama.cpp: '' is not a release archive's file name",
        ),
        (
            "llama.cpp",
            {"version": "b1", "index_url": "https://pypi.example/simple"},
            r"^llama.cpp: index_url is for vLLM, SGLang, FreeToken and TensorRT-LLM",
        ),
        (
            "vllm",
            {"version": "0.11.0", "index_url": "ftp://pypi.example/simple"},
            r"^vllm: index_url must be an http\(s\) URL, not 'ftp://pypi.example/simple'",
        ),
        (
            "sglang",
            {"version": "0.5.3", "index_url": "https://pypi example/simple"},
            r"^sglang: index_url must be an http\(s\) URL",
        ),
        (
            "vllm",
            {"version": "0.11.0", "index_url": 5},
            r"^vllm: index_url must be an http\(s\) URL, not 5",
        ),
        (
            "vllm",
            {"version": "0.11.0", "sha": {}, "url": "x"},
            r"^vllm: unknown key\(s\) sha, url \(version, sha256, index_url, packages\)",
        ),
        (
            "llama.cpp",
            {"version": "b1", "packages": {"yum": ["libgomp"]}},
            r"^llama.cpp: packages: 'yum' is not a package manager llmgw uses \(apt, dnf\)",
        ),
        (
            "llama.cpp",
            {"version": "b1", "packages": {"apt": ["-oAPT::Get::x=1"]}},
            r"^llama.cpp: packages: '-oAPT::Get::x=1' is not a package name",
        ),
        (
            "llama.cpp",
            {"version": "b1", "packages": {"apt": {"libgomp1": 1}}},
            r"^llama.cpp: packages: apt takes a list of package names",
        ),
        (
            "llama.cpp",
            {"version": "b1", "packages": ["libgomp1"]},
            r"^llama.cpp: packages maps a package manager \(apt, dnf\) to package names",
        ),
    ],
)
def test_each_refusal_names_the_engine_and_the_problem(name: str, value: Any, words: str) -> None:
    with pytest.raises(PinError, match=words):
        parse_want(name, value)


def test_an_engines_os_packages_are_kept_per_manager_and_left_out_when_none() -> None:
    want = parse_want("llama.cpp", {"version": 6000, "packages": {"apt": "libgomp1", "dnf": []}})
    assert want == {
        "version": "b6000",
        "sha256": {},
        "index_url": None,
        "packages": {"apt": ["libgomp1"]},
    }
    assert "packages" not in parse_want("llama.cpp", {"version": 6000, "packages": {}})
    # What an agent takes of the fleet's message.
    assert want_of(want)["packages"] == {"apt": ["libgomp1"]}


def test_a_whole_map_drops_null_entries_and_refuses_a_bad_one_by_name() -> None:
    assert parse_wanted({"llama.cpp": 6000, "vllm": None, "sglang": "0.5.3"}) == {
        "llama.cpp": {"version": "b6000", "sha256": {}, "index_url": None},
        "sglang": {"version": "0.5.3", "sha256": {}, "index_url": None},
    }
    assert parse_wanted({}) == {}
    assert parse_wanted({"vllm": None}) == {}
    with pytest.raises(PinError, match=r"^vllm: 'not a version!' is not a version"):
        parse_wanted({"llama.cpp": "b6000", "vllm": "not a version!"})


def test_engines_and_builds_are_checked_by_name() -> None:
    for name in ("llama.cpp", "vllm", "sglang"):
        assert check_engine(name) == name
    with pytest.raises(PinError, match="'llamacpp' is not an engine"):
        check_engine("llamacpp")
    for build in ("auto", "cu13", "cu129", "cpu", "none"):
        assert check_build(build) == build
    with pytest.raises(PinError, match=r"^'cuda' is not a build \(choose auto, cu13, cu129"):
        check_build("cuda")


def test_pinned_is_a_copy_each_caller_may_change() -> None:
    first = pinned()
    assert first == PINNED
    assert first["llama.cpp"]["version"] == LLAMACPP_PIN
    first["llama.cpp"]["version"] = "b1"
    first["llama.cpp"]["sha256"]["x.tar.gz"] = HEX
    first["vllm"] = {"version": "0.11.0", "sha256": {}}
    assert PINNED["llama.cpp"]["version"] == LLAMACPP_PIN
    assert "x.tar.gz" not in PINNED["llama.cpp"]["sha256"]
    assert "vllm" not in PINNED
    second = pinned()
    assert second == PINNED and second is not first
    assert second["llama.cpp"]["sha256"] is not PINNED["llama.cpp"]["sha256"]


def test_the_release_pin_is_itself_a_valid_wish() -> None:
    for name, want in PINNED.items():
        assert parse_want(name, want)["version"] == want["version"]


def test_an_agent_takes_of_a_want_what_is_of_its_kind() -> None:
    from llmgw.enginepins import want_of

    full = {"version": "b1", "sha256": {"a.zip": "f" * 64}, "index_url": None}
    assert want_of(full) == full
    assert want_of({"version": 7, "sha256": "x", "index_url": 3}) == {"index_url": None}
    assert want_of({}) == {}
