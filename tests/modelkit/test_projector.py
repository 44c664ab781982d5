"""Which multimodal projector goes with a GGUF model, and which configs take images."""

from __future__ import annotations

import pytest

from llmgw.modelkit.projector import (
    choose_projector,
    is_projector,
    precision_of,
    takes_images_config,
)


def test_a_projector_is_a_gguf_whose_name_begins_mmproj() -> None:
    assert is_projector("mmproj-F16.gguf")
    assert is_projector("sub/MMPROJ-model-f32.gguf")
    assert not is_projector("mmproj-notes.txt")
    assert not is_projector("model-mmproj-F16.gguf")
    assert not is_projector("model-Q4_K_M.gguf")


def test_none_without_a_projector_and_the_one_when_alone() -> None:
    assert choose_projector(["model-Q4_K_M.gguf", "README.md"], "model-Q4_K_M.gguf") is None
    assert (
        choose_projector(["model-Q4_K_M.gguf", "mmproj-model-f32.gguf"], "model-Q4_K_M.gguf")
        == "mmproj-model-f32.gguf"
    )


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("model-Q8_0.gguf", "mmproj-Q8_0.gguf"),  # the model's own precision
        ("model-BF16.gguf", "mmproj-BF16.gguf"),  # BF16 is not F16
        ("model-F32.gguf", "mmproj-F32.gguf"),
        ("model-Q4_K_M.gguf", "mmproj-F16.gguf"),  # no Q4_K_M projector: F16
        ("model-IQ2_XS.gguf", "mmproj-F16.gguf"),
    ],
)
def test_among_several_the_models_precision_then_f16(model: str, expected: str) -> None:
    files = [model, "mmproj-BF16.gguf", "mmproj-F32.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf"]
    assert choose_projector(files, model) == expected


def test_without_f16_the_first_by_path() -> None:
    files = ["m-Q4_K_M.gguf", "mmproj-b-F32.gguf", "mmproj-a-F32.gguf"]
    assert choose_projector(files, "m-Q4_K_M.gguf") == "mmproj-a-F32.gguf"


def test_a_projector_beside_the_model_over_one_elsewhere() -> None:
    files = ["mmproj-F16.gguf", "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/mmproj-F32.gguf"]
    assert choose_projector(files, files[1]) == "Q4_K_M/mmproj-F32.gguf"
    # One in another folder still goes with a model that has none beside it.
    assert choose_projector(["top/mmproj-F16.gguf", "m.gguf"], "m.gguf") == "top/mmproj-F16.gguf"


def test_a_projector_never_goes_with_itself() -> None:
    assert choose_projector(["mmproj-F16.gguf"], "mmproj-F16.gguf") is None


def test_precision_is_read_as_a_whole_word() -> None:
    assert precision_of("model-BF16.gguf") == "BF16"
    assert precision_of("model-F16.gguf") == "F16"
    assert precision_of("model-Q8_0.gguf") == "Q8_0"
    assert precision_of("model-Q4_K_M.gguf") is None  # Q4_K is not Q4_K_M


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, False),
        ({"architectures": ["Qwen2VLForConditionalGeneration"]}, True),
        ({"architectures": ["LlavaForConditionalGeneration"]}, True),
        ({"architectures": ["Gemma3ForConditionalGeneration"]}, True),
        ({"architectures": ["T5ForConditionalGeneration"]}, False),
        ({"architectures": ["SomethingNew"], "vision_config": {"hidden_size": 8}}, True),
        ({"vision_config": None}, False),
        ({}, False),
    ],
)
def test_a_config_takes_images_by_its_vision_config_or_architecture(
    config: dict[str, object], expected: bool
) -> None:
    assert takes_images_config(config) is expected
