"""A GGUF model's projector: fetched from the hub with it, found in the cache or beside
a local file, and what the shard's spec and its word on images become."""

from __future__ import annotations

import json
from pathlib import Path

from weights_fakehub import FakeHub, Progress, blob

from llmgw.agent.weights import WeightStore, cache_name
from llmgw.agent.weights.projector import find_projector, prepare
from llmgw.wire.messages import ShardSpec

REPO = "org/eye-GGUF"


def spec(**kw: object) -> ShardSpec:
    return ShardSpec(
        replica_id="eye.default.0123abcd",
        engine="llama.cpp",
        source="/x",
        port=1,
        key="k",
        fingerprint="f",
        **kw,  # type: ignore[arg-type]
    )


async def test_a_quantisation_is_fetched_with_its_projector(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    hub.add(REPO, "eye-Q4_K_M.gguf", blob(3000, 1))
    hub.add(REPO, "eye-Q8_0.gguf", blob(3000, 2))
    f16 = hub.add(REPO, "mmproj-eye-F16.gguf", blob(2000, 3))
    hub.add(REPO, "mmproj-eye-F32.gguf", blob(4000, 4))
    path = await store.fetch(
        f"hf:{REPO}:Q4_K_M", allow_pickle=False, replica_id="r1", progress=Progress()
    )
    directory = cache / cache_name(f"hf:{REPO}:Q4_K_M")
    assert path == directory / "eye-Q4_K_M.gguf"
    fetched = sorted(d.path.rsplit("/", 1)[1] for d in hub.downloads())
    assert fetched == ["eye-Q4_K_M.gguf", "mmproj-eye-F16.gguf"]
    marker = json.loads((directory / ".llmgw-complete.json").read_text())
    assert marker["entry"] == "eye-Q4_K_M.gguf"
    projector = find_projector(path)
    assert projector == directory / "mmproj-eye-F16.gguf"
    assert projector.read_bytes() == f16.content


async def test_a_repository_without_a_projector_fetches_the_model_alone(
    hub: FakeHub, store: WeightStore
) -> None:
    hub.add(REPO, "eye-Q4_K_M.gguf", blob(3000, 1))
    path = await store.fetch(
        f"hf:{REPO}:Q4_K_M", allow_pickle=False, replica_id="r1", progress=Progress()
    )
    assert [d.path.rsplit("/", 1)[1] for d in hub.downloads()] == ["eye-Q4_K_M.gguf"]
    assert find_projector(path) is None


def test_a_local_gguf_finds_its_projector_beside_it(tmp_path: Path) -> None:
    model = tmp_path / "eye-Q8_0.gguf"
    model.write_bytes(b"GGUF")
    assert find_projector(model) is None
    (tmp_path / "mmproj-eye-F16.gguf").write_bytes(b"GGUF")
    (tmp_path / "mmproj-eye-Q8_0.gguf").write_bytes(b"GGUF")
    (tmp_path / "mmproj-notes.txt").write_text("not one")
    assert find_projector(model) == tmp_path / "mmproj-eye-Q8_0.gguf"
    # A directory (safetensors) has no projector.
    assert find_projector(tmp_path) is None


def test_a_cached_source_whose_projector_went_missing_has_none(tmp_path: Path) -> None:
    (tmp_path / "eye-Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / ".llmgw-complete.json").write_text(
        json.dumps(
            {
                "source": "hf:org/eye:Q4_K_M",
                "name": "n",
                "entry": "eye-Q4_K_M.gguf",
                "files": [
                    {"path": "eye-Q4_K_M.gguf", "size": 4},
                    {"path": "mmproj-F16.gguf", "size": 4},
                ],
            }
        )
    )
    assert find_projector(tmp_path / "eye-Q4_K_M.gguf") is None
    (tmp_path / "mmproj-F16.gguf").write_bytes(b"GGUF")
    assert find_projector(tmp_path / "eye-Q4_K_M.gguf") == tmp_path / "mmproj-F16.gguf"


def test_prepare_gives_llamacpp_the_projector_and_says_vision(tmp_path: Path) -> None:
    model = tmp_path / "eye.gguf"
    model.write_bytes(b"GGUF")
    given, vision = prepare(spec(), "projector", model)
    assert (given.projector, vision) == (None, False)
    (tmp_path / "mmproj-eye.gguf").write_bytes(b"GGUF")
    given, vision = prepare(spec(), "projector", model)
    assert (given.projector, vision) == (str(tmp_path / "mmproj-eye.gguf"), True)


def test_prepare_reads_a_safetensors_models_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert prepare(spec(), "config", tmp_path)[1] is False
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Qwen2VLForConditionalGeneration"]})
    )
    assert prepare(spec(), "config", tmp_path) == (spec(), True)
    assert prepare(spec(), None, tmp_path) == (spec(), False)
