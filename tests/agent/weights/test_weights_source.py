"""Source forms, their normal form and cache name, and the pickle rule by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.weights import (
    PickleRefused,
    SourceError,
    cache_name,
    is_cache_name,
    is_pickled,
    normalise_source,
    parse_source,
)
from llmgw.modelkit.sources import check_named_pickle


def test_hf_forms() -> None:
    whole = parse_source("hf:Qwen/Qwen2.5-0.5B-Instruct")
    assert (whole.kind, whole.repo, whole.quant, whole.file) == (
        "hf",
        "Qwen/Qwen2.5-0.5B-Instruct",
        None,
        None,
    )
    quant = parse_source("hf:TheBloke/Llama-2-7B-GGUF:q4_k_m")
    assert quant.quant == "Q4_K_M" and quant.file is None
    assert quant.text == "hf:thebloke/llama-2-7b-gguf:Q4_K_M"
    unsloth = parse_source("hf:unsloth/X-GGUF:UD-Q4_K_XL")
    assert unsloth.quant == "UD-Q4_K_XL"
    file = parse_source("hf:org/repo:Q4_K_M/model-Q4_K_M-00001-of-00002.gguf")
    assert file.file == "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf" and file.quant is None


def test_url_and_local_forms() -> None:
    url = parse_source("https://Example.com/models/tiny.gguf?download=1#frag")
    assert url.kind == "url" and url.filename == "tiny.gguf"
    assert url.text == "https://example.com/models/tiny.gguf?download=1"
    local = parse_source("/srv/models/tiny.gguf")
    assert local.kind == "local" and local.path == Path("/srv/models/tiny.gguf")


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("", "empty"),
        ("hf:", "ORG/REPO"),
        ("hf:justarepo", "ORG/REPO"),
        ("hf://org/repo", "without //"),
        ("hf:org/repo/extra", "ORG/REPO"),
        ("hf:org/re po", "not a Hugging Face name"),
        ("hf:org/re--po", "not a Hugging Face name"),
        ("hf:org/repo:", "nothing after ':'"),
        ("hf:org/repo:Q4 K", "neither a quantisation"),
        ("hf:org/repo:../escape.gguf", "'..'"),
        ("hf:org/repo:/abs.gguf", "relative path"),
        ("hf:org/repo:.llmgw-complete.json", "hidden"),
        ("hf:org/repo:model.gguf.part", ".part"),
        ("models/tiny.gguf", "must be absolute"),
        ("~/tiny.gguf", "must be absolute"),
        ("/srv/../etc/passwd", "'..'"),
        ("s3://bucket/x.gguf", "'s3' is not fetched"),
        ("https://host/", "must end in a file name"),
        ("https://user:pw@host/x.gguf", "user or password"),
        ("https:///x.gguf", "no host"),
    ],
)
def test_bad_sources_say_what_is_wrong_and_the_forms(source: str, words: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_source(source)
    message = str(info.value)
    assert words in message
    # Every refusal that is about the form shows the forms accepted.
    if words in ("empty", "ORG/REPO", "must be absolute", "'s3' is not fetched"):
        assert "accepted forms: hf:ORG/REPO" in message


def test_plain_http_only_to_loopback_or_on_purpose() -> None:
    with pytest.raises(SourceError, match="plain http:// is refused"):
        parse_source("http://mirror.internal/x.gguf")
    assert parse_source("http://mirror.internal/x.gguf", allow_http=True).kind == "url"
    for host in ("127.0.0.1", "127.8.9.1:8080", "localhost", "[::1]"):
        assert parse_source(f"http://{host}/x.gguf").kind == "url"


def test_cache_name_is_a_readable_prefix_and_a_hash_of_the_normal_form() -> None:
    name = cache_name("hf:TheBloke/Llama-2-7B-GGUF:Q4_K_M")
    assert name.startswith("hf--thebloke--llama-2-7b-gguf--q4_k_m--")
    assert is_cache_name(name)
    # Equal forms share a directory; different sources never do.
    assert cache_name("hf:thebloke/llama-2-7b-gguf:q4_k_m") == name
    assert cache_name(" hf:TheBloke/Llama-2-7B-GGUF:Q4_K_M ") == name
    assert cache_name("hf:TheBloke/Llama-2-7B-GGUF:Q5_K_M") != name
    assert cache_name("hf:TheBloke/Llama-2-7B-GGUF") != name
    url_name = cache_name("https://example.com/a/tiny.gguf")
    assert url_name.startswith("url--example.com--tiny.gguf--") and is_cache_name(url_name)
    assert cache_name("https://example.com/b/tiny.gguf") != url_name
    assert normalise_source("hf:A/B:q8_0") == "hf:a/b:Q8_0"


def test_cache_name_stays_in_its_form_for_awkward_names() -> None:
    long_file = "hf:org/repo:" + "d/" * 20 + "X" * 90 + ".gguf"
    assert is_cache_name(cache_name(long_file))
    assert is_cache_name(cache_name("https://h/%E2%9C%93weird%20name.gguf"))


def test_a_local_path_has_no_cache_name() -> None:
    with pytest.raises(SourceError, match="used where it is"):
        cache_name("/srv/models/tiny.gguf")


@pytest.mark.parametrize(
    "name",
    [
        "not-ours",
        "hf--org--repo",
        "hf--org--repo--0123456789abcdeg",
        "xx--org--repo--0123456789abcdef",
        "hf--org--repo--0123456789abcdef/..",
        "../hf--org--repo--0123456789abcdef",
        ".hf--org--repo--0123456789abcdef",
    ],
)
def test_is_cache_name_refuses_other_names(name: str) -> None:
    assert not is_cache_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "pytorch_model.bin",
        "model.PT",
        "x.pth",
        "x.ckpt",
        "x.pkl",
        "x.pickle",
        "x.pt2",
        "x.joblib",
        "https://h/model.pt?download=true",
        "https://h/model.bin#frag",
    ],
)
def test_pickled_names(name: str) -> None:
    assert is_pickled(name)


@pytest.mark.parametrize(
    "name", ["model.safetensors", "x.gguf", "pytorch_model.bin.index.json", "binary.txt"]
)
def test_not_pickled_names(name: str) -> None:
    assert not is_pickled(name)


def test_a_source_naming_a_pickle_is_refused_with_how_to_allow_it() -> None:
    for text in ("hf:org/repo:weights/model.pt", "https://h/x.ckpt?dl=1", "/srv/m.pkl"):
        src = parse_source(text)
        with pytest.raises(PickleRefused) as info:
            check_named_pickle(src, allow_pickle=False)
        assert "allow_pickle: true" in str(info.value)
        check_named_pickle(src, allow_pickle=True)


def test_the_package_exports_one_sorted_surface() -> None:
    import llmgw.agent.weights as weights

    assert weights.__all__ == sorted(weights.__all__)
    assert all(hasattr(weights, name) for name in weights.__all__)
