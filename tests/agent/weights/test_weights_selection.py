"""Which files of a repository a source means: quantisations, splits, whole repos."""

from __future__ import annotations

import pytest

from llmgw.agent.weights import (
    HubError,
    HubFile,
    HubNotFound,
    SourceError,
    parse_source,
    select_files,
)


def listing(*paths: str) -> list[HubFile]:
    return [HubFile(path=p, size=10) for p in paths]


def pick(source: str, files: list[HubFile]) -> tuple[list[str], str]:
    selection = select_files(parse_source(source), files)
    return [f.path for f in selection.files], selection.entry


GGUF_REPO = listing(
    "README.md",
    "model-Q4_K.gguf",
    "model-Q4_K_M.gguf",
    "model-IQ4_XS.gguf",
    "model-Q4_XS.gguf",
    "model-Q8_0.gguf",
    "model-F16.gguf",
    "mmproj-model-F16.gguf",
)


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ("Q4_K_M", "model-Q4_K_M.gguf"),
        ("q4_k_m", "model-Q4_K_M.gguf"),
        ("Q4_K", "model-Q4_K.gguf"),  # not Q4_K_M
        ("Q4_XS", "model-Q4_XS.gguf"),  # not IQ4_XS
        ("IQ4_XS", "model-IQ4_XS.gguf"),
        ("f16", "model-F16.gguf"),  # not the multimodal projector
    ],
)
def test_a_quantisation_picks_its_one_gguf(quant: str, expected: str) -> None:
    # With the repository's multimodal projector: a vision model's other half.
    projector = "mmproj-model-F16.gguf"
    assert pick(f"hf:org/repo:{quant}", GGUF_REPO) == ([expected, projector], expected)
    assert select_files(parse_source(f"hf:org/repo:{quant}"), GGUF_REPO).projector == projector


def test_a_missing_quantisation_names_the_files_there() -> None:
    with pytest.raises(HubNotFound) as info:
        pick("hf:org/repo:Q2_K", GGUF_REPO)
    assert "no GGUF file carries Q2_K" in str(info.value)
    assert "model-Q8_0.gguf" in str(info.value)


def test_two_files_for_one_quantisation_is_ambiguous() -> None:
    files = listing("base-Q4_K_M.gguf", "instruct-Q4_K_M.gguf")
    with pytest.raises(SourceError) as info:
        pick("hf:org/repo:Q4_K_M", files)
    assert "base-Q4_K_M.gguf" in str(info.value) and "instruct-Q4_K_M.gguf" in str(info.value)
    assert "hf:ORG/REPO:PATH.gguf" in str(info.value)


SPLIT_REPO = listing(
    "model-Q8_0.gguf",
    "Q4_K_M/model-Q4_K_M-00003-of-00003.gguf",
    "Q4_K_M/model-Q4_K_M-00001-of-00003.gguf",
    "Q4_K_M/model-Q4_K_M-00002-of-00003.gguf",
)
SPLIT_PARTS = [f"Q4_K_M/model-Q4_K_M-0000{n}-of-00003.gguf" for n in (1, 2, 3)]


def test_a_quantisation_takes_every_part_of_a_split_gguf_first_part_first() -> None:
    assert pick("hf:org/repo:Q4_K_M", SPLIT_REPO) == (SPLIT_PARTS, SPLIT_PARTS[0])


def test_a_named_part_brings_its_siblings_and_the_entry_is_the_first() -> None:
    assert pick(f"hf:org/repo:{SPLIT_PARTS[1]}", SPLIT_REPO) == (SPLIT_PARTS, SPLIT_PARTS[0])


def test_a_split_set_missing_a_part_is_refused() -> None:
    files = [f for f in SPLIT_REPO if "00002" not in f.path]
    with pytest.raises(HubNotFound, match=r"lacks part\(s\) 2"):
        pick("hf:org/repo:Q4_K_M", files)


def test_a_named_file_alone_or_not_found() -> None:
    assert pick("hf:org/repo:model-Q8_0.gguf", SPLIT_REPO) == (
        ["model-Q8_0.gguf"],
        "model-Q8_0.gguf",
    )
    with pytest.raises(HubNotFound, match="no file 'nope.gguf'"):
        pick("hf:org/repo:nope.gguf", SPLIT_REPO)


def test_a_whole_repository_is_its_safetensors_and_their_json_and_tokenizer() -> None:
    files = listing(
        ".gitattributes",
        "README.md",
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer.model",
        "chat_template.jinja",
        "training_args.bin",
        "optimizer.pt",
        "original/consolidated.00.pth",
    )
    paths, entry = pick("hf:org/repo", files)
    assert entry == ""
    assert paths == sorted(
        [
            "config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer.model",
            "chat_template.jinja",
        ]
    )


def test_a_repository_of_only_pickles_selects_them_for_the_pickle_rule() -> None:
    paths, _ = pick("hf:org/repo", listing("config.json", "pytorch_model.bin"))
    assert paths == ["config.json", "pytorch_model.bin"]


def test_a_gguf_repository_without_a_selector_says_to_name_one() -> None:
    with pytest.raises(SourceError) as info:
        pick("hf:org/repo", GGUF_REPO)
    assert "hf:org/repo:QUANT" in str(info.value) and "model-Q8_0.gguf" in str(info.value)


def test_a_repository_without_weights() -> None:
    with pytest.raises(HubNotFound, match="no weights"):
        pick("hf:org/repo", listing("README.md"))


@pytest.mark.parametrize("bad", ["../../etc/cron.d/x", "/etc/passwd", "a//b", "a\\b.json"])
def test_an_unsafe_path_in_a_listing_is_refused(bad: str) -> None:
    with pytest.raises(HubError, match="unsafe path"):
        pick("hf:org/repo", listing("model.safetensors", bad))


def test_hidden_files_are_never_selected() -> None:
    files = listing("model.safetensors", ".cache/x.json", ".llmgw-complete.json", "a/.b.json")
    assert pick("hf:org/repo", files) == (["model.safetensors"], "")
