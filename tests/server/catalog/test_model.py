"""The catalog: profiles kept and read back, fingerprints, replica ids, the StartShard a
profile becomes, default names and engines, and what ``check_model`` refuses or works out."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from llmgw.modelkit import sizing
from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.model import (
    CARD_HOST_MEMORY,
    DEFAULT_CONTEXT,
    GIB,
    MAX_SLOTS,
    CatalogError,
    Model,
    Profile,
    check_model,
    check_source,
    default_context,
    default_engine,
    default_name,
    fingerprint,
    new_replica_id,
    parse_replica_id,
    shape_of,
    shard_spec,
    with_change,
)

MiB = 1024**2

# A Llama-3-8B-like GGUF at Q4_K_M: 32 layers, 32 heads, 8 KV heads of 128.
LLAMA_8B = ModelShape(
    architecture="llama",
    parameters=8_030_000_000,
    file_bytes=4_920_000_000,
    layers=32,
    embedding=4096,
    heads=32,
    kv_heads=8,
    head_size=128,
    value_head_size=128,
    trained_context=8192,
    quantisation="Q4_K_M",
    name="Llama 3 8B",
)
# K and V, 8 heads of 128, fp16, over 32 layers.
LLAMA_8B_KV_PER_TOKEN = 32 * 8 * (128 + 128) * 2

TINY = ModelShape(
    architecture="llama",
    parameters=1_000_000,
    file_bytes=4 * MiB,
    layers=2,
    embedding=64,
    heads=4,
    kv_heads=2,
    head_size=16,
    value_head_size=16,
    trained_context=2048,
)


def profile(**overrides: object) -> Profile:
    base: dict[str, object] = dict(name="cpu", engine="llama.cpp")
    base.update(overrides)
    return Profile(**base)  # type: ignore[arg-type]


def model(*profiles: Profile, **overrides: object) -> Model:
    base: dict[str, object] = dict(
        name="llama-3-8b",
        source="hf:meta/Llama-3-8B-GGUF:Q4_K_M",
        engine="llama.cpp",
        profiles=profiles or (profile(),),
        context=4096,
    )
    base.update(overrides)
    return Model(**base)  # type: ignore[arg-type]


def refused(m: Model, shape: ModelShape | None) -> CatalogError:
    with pytest.raises(CatalogError) as caught:
        check_model(m, shape)
    return caught.value


# --------------------------------------------------------------------- kept and read


def test_profile_spec_round_trip() -> None:
    p = profile(
        name="gpu",
        engine="vllm",
        args=("--dtype", "bfloat16"),
        cards=2,
        cpu_cores=3.5,
        replicas=4,
        priority=10,
        selector={"zone": "a"},
        role="chat",
        memory=GIB,
        card_memory=9 * GIB,
        memory_set=True,
    )
    spec = p.to_spec()
    # Kept as JSON: lists and dicts, no tuples.
    assert spec["args"] == ["--dtype", "bfloat16"]
    assert spec["selector"] == {"zone": "a"}
    back = Profile.from_spec(json.loads(json.dumps(spec)))
    assert back == p
    assert isinstance(back.args, tuple)


def test_profile_from_spec_ignores_unknown_keys_and_fills_defaults() -> None:
    back = Profile.from_spec({"name": "cpu", "engine": "llama.cpp", "later_field": 1})
    assert back == Profile("cpu", "llama.cpp")
    assert back.args == ()
    assert back.selector == {}


def test_model_spec_round_trip() -> None:
    m = model(
        profile(args=("--jinja",)),
        profile(name="gpu", engine="llama.cpp", cards=1, priority=5),
        replaced=("abc",),
        shape={"layers": 32},
        max_output=512,
    )
    back = Model.from_spec(json.loads(json.dumps(m.to_spec())))
    assert back == m
    assert back.replicas == 2
    assert back.profile("gpu") == m.profiles[1]
    assert back.profile("nope") is None


# ----------------------------------------------------------------------- fingerprint


@pytest.mark.parametrize(
    ("model_change", "profile_change"),
    [
        ({}, {"args": ("--jinja",)}),
        ({"context": 8192}, {}),
        ({"slots": 2}, {}),
        ({}, {"cards": 1}),
        ({}, {"cpu_cores": 4.0}),
        ({"source": "hf:meta/Llama-3-8B-GGUF:Q8_0"}, {}),
        ({}, {"engine": "vllm"}),
        ({"allow_pickle": True}, {}),
        ({"restart": 1}, {}),
    ],
)
def test_fingerprint_changes_with_what_makes_a_replica(
    model_change: dict[str, object], profile_change: dict[str, object]
) -> None:
    p = profile()
    m = model(p)
    changed_p = replace(p, **profile_change)  # type: ignore[arg-type]
    changed_m = replace(m, **model_change)  # type: ignore[arg-type]
    assert fingerprint(changed_m, changed_p) != fingerprint(m, p)


@pytest.mark.parametrize(
    "profile_change",
    [
        {"memory": 9 * GIB},
        {"card_memory": 7 * GIB},
        {"memory_set": True},
        {"replicas": 5},
        {"priority": 3},
    ],
)
def test_fingerprint_ignores_memory_figures_and_scaling(
    profile_change: dict[str, object],
) -> None:
    p = profile()
    m = model(p)
    assert fingerprint(m, replace(p, **profile_change)) == fingerprint(m, p)  # type: ignore[arg-type]


def test_fingerprint_is_stable_and_short_hex() -> None:
    m = model()
    fp = fingerprint(m, m.profiles[0])
    assert fp == fingerprint(Model.from_spec(m.to_spec()), m.profiles[0])
    assert re.fullmatch(r"[0-9a-f]{16}", fp)


# ------------------------------------------------------------------------ replica ids


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "llama-3-8b", "m", "a.b.c_d"])
def test_replica_id_parses_back(name: str) -> None:
    rid = new_replica_id(name, "gpu-1")
    assert rid.startswith(f"{name}.gpu-1.")
    assert parse_replica_id(rid) == (name, "gpu-1")


def test_replica_ids_are_unique() -> None:
    assert len({new_replica_id("m", "cpu") for _ in range(50)}) == 50


def test_longest_names_make_an_id_of_at_most_80_characters() -> None:
    rid = new_replica_id("m" * 48, "p" * 16)
    assert len(rid) <= 80
    assert parse_replica_id(rid) == ("m" * 48, "p" * 16)


@pytest.mark.parametrize(
    "rid",
    [
        "r1",  # from `ctl shard start`
        "m.cpu",
        "m.cpu.abcdef1",  # seven hex digits
        "m.cpu.abcdef123",
        "m.CPU.abcdef12",  # profile names are lower case
        "m.cpu.ABCDEF12",
        ".cpu.abcdef12",
    ],
)
def test_other_ids_are_not_catalog_replicas(rid: str) -> None:
    assert parse_replica_id(rid) is None


# ------------------------------------------------------------------------ shard spec


def test_shard_spec_has_profile_args_then_the_catalogs_context() -> None:
    p = profile(name="gpu", cards=1, args=("--jinja", "-ngl", "99"), cpu_cores=2.5)
    m = model(p, context=8192, slots=4, allow_pickle=True)
    spec = shard_spec(m, p, "llama-3-8b.gpu.0123abcd", 9100, ["GPU-1"], "k3y")
    assert spec.args == ["--jinja", "-ngl", "99", "--ctx-size", "32768", "--parallel", "4"]
    assert spec.replica_id == "llama-3-8b.gpu.0123abcd"
    assert spec.engine == "llama.cpp"
    assert spec.source == m.source
    assert spec.model == "llama-3-8b"
    assert spec.port == 9100
    assert spec.key == "k3y"
    assert spec.cards == ["GPU-1"]
    assert spec.cpu_cores == 3  # rounded up
    assert spec.allow_pickle is True
    assert spec.fingerprint == fingerprint(m, p)


def test_shard_spec_vllm_context_and_no_cpu_limit() -> None:
    p = profile(name="gpu", engine="vllm", cards=2, args=("--dtype", "half"))
    m = model(p, source="hf:meta/Llama-3-8B", engine="vllm", context=8192, slots=16)
    spec = shard_spec(m, p, "r", 8000, ("0", "1"), "k")
    assert spec.args == ["--dtype", "half", "--max-model-len", "8192", "--max-num-seqs", "16"]
    assert spec.cards == ["0", "1"]
    assert spec.cpu_cores is None


def test_shard_spec_whole_cores_stay() -> None:
    p = profile(cpu_cores=4.0)
    assert shard_spec(model(p), p, "r", 1, [], "k").cpu_cores == 4


# -------------------------------------------------------------- default engine / name


@pytest.mark.parametrize(
    ("source", "engine"),
    [
        ("hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "llama.cpp"),
        ("hf:org/repo:sub/model-Q4_K_M.gguf", "llama.cpp"),
        ("/models/Llama-3-8B.Q4_K_M.GGUF", "llama.cpp"),
        ("https://example.com/m/model.gguf", "llama.cpp"),
        ("hf:meta-llama/Llama-3.1-8B-Instruct", "vllm"),
        ("/models/llama-3-8b", "vllm"),
        ("https://example.com/m/model.safetensors", "vllm"),
    ],
)
def test_default_engine(source: str, engine: str) -> None:
    assert default_engine(source) == engine


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "qwen2.5-0.5b-instruct-gguf-q4_k_m"),
        ("hf:meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"),
        ("hf:meta-llama/Llama-3.1-8B-Instruct/", "llama-3.1-8b-instruct"),
        # A file path after the repository adds nothing: the repository names the model.
        ("hf:org/Repo-GGUF:sub/model-Q4_K_M.gguf", "repo-gguf"),
        ("https://example.com/files/Mistral-7B.Q4_K_M.gguf", "mistral-7b.q4_k_m"),
        ("https://example.com/files/Phi 3 mini.gguf?download=true", "phi-3-mini"),
        ("/models/Llama-3-8B.Q4_K_M.gguf", "llama-3-8b.q4_k_m"),
        ("/models/llama-3-8b/", "llama-3-8b"),
        ("/models/@@@.gguf", "model"),
    ],
)
def test_default_name(source: str, name: str) -> None:
    got = default_name(source)
    assert got == name
    assert catalog.MODEL_NAME.match(got)


def test_default_name_is_cut_to_48_characters() -> None:
    got = default_name("hf:org/" + "a" * 60 + "-b")
    assert got == "a" * 48
    assert catalog.check_name(got) == got


# ---------------------------------------------------------------------------- source


@pytest.mark.parametrize(
    ("source", "normal"),
    [
        ("hf:Meta/Llama-3-8B-GGUF:q4_k_m", "hf:meta/llama-3-8b-gguf:Q4_K_M"),
        ("  hf:Meta/Llama-3-8B ", "hf:meta/llama-3-8b"),
        ("/models/a/./b.gguf", "/models/a/b.gguf"),
        ("https://example.com/m/model.gguf#part", "https://example.com/m/model.gguf"),
    ],
)
def test_check_source_gives_the_normal_form(source: str, normal: str) -> None:
    assert check_source(source, allow_pickle=False) == normal


@pytest.mark.parametrize(
    "source",
    [
        "",
        "models/x.gguf",  # relative
        "ftp://example.com/x.gguf",
        "hf:llama",  # no ORG/REPO
        "hf://org/repo",
        "hf:org/repo:",
        "/models/../etc/passwd",
        "https://user:pw@example.com/x.gguf",
    ],
)
def test_check_source_refuses_bad_forms(source: str) -> None:
    with pytest.raises(CatalogError) as caught:
        check_source(source, allow_pickle=False)
    assert caught.value.field == "source"
    assert str(caught.value).startswith("source: ")


@pytest.mark.parametrize(
    "source",
    [
        "https://example.com/m/model.pt",
        "https://example.com/m/model.bin?download=true",
        "hf:org/repo:weights/pytorch_model.bin",
        "/models/model.ckpt",
        "/models/model.PKL",
    ],
)
def test_check_source_refuses_named_pickles_unless_allowed(source: str) -> None:
    with pytest.raises(CatalogError) as caught:
        check_source(source, allow_pickle=False)
    assert caught.value.field == "source"
    assert "pickle" in str(caught.value)
    assert check_source(source, allow_pickle=True)


def test_check_model_refuses_a_pickled_source_and_keeps_the_normal_form() -> None:
    m = model(
        source="/models/model.pt", engine="vllm", profiles=(profile(engine="vllm"),), context=1024
    )
    assert refused(m, TINY).field == "source"
    kept = check_model(replace(m, allow_pickle=True), TINY)
    assert kept.source == "/models/model.pt"
    kept = check_model(model(source="hf:Meta/Llama-3-8B-GGUF:q4_k_m"), LLAMA_8B)
    assert kept.source == "hf:meta/llama-3-8b-gguf:Q4_K_M"


# -------------------------------------------------------------------- check_model


@pytest.mark.parametrize("name", ["", "-lead", "has space", "a/b", "x" * 49, ".dot"])
def test_bad_model_name_is_refused(name: str) -> None:
    err = refused(model(name=name), LLAMA_8B)
    assert err.field == "name"
    assert "--name" in str(err)


def test_a_model_needs_a_profile() -> None:
    err = refused(model(profiles=()), LLAMA_8B)
    assert err.field == "profiles"
    assert "at least one profile" in str(err)


def test_profile_names_must_differ() -> None:
    err = refused(model(profile(), profile(cpu_cores=2)), LLAMA_8B)
    assert err.field == "profiles"
    assert "share a name" in str(err)


@pytest.mark.parametrize("name", ["GPU", "a.b", "x" * 17, "-a", ""])
def test_bad_profile_name_is_refused(name: str) -> None:
    assert refused(model(profile(name=name)), LLAMA_8B).field == "profile"


def test_context_below_256_is_refused() -> None:
    err = refused(model(context=255), LLAMA_8B)
    assert err.field == "context"
    assert "256" in str(err)
    assert check_model(model(context=256), LLAMA_8B).context == 256


def test_context_past_the_trained_context_is_refused() -> None:
    err = refused(model(context=8193), LLAMA_8B)
    assert err.field == "context"
    assert "8192" in str(err)
    assert check_model(model(context=8192), LLAMA_8B).context == 8192


def test_context_unbounded_when_the_shape_does_not_know_it() -> None:
    untrained = replace(LLAMA_8B, trained_context=None)
    assert check_model(model(context=131072), untrained).context == 131072


@pytest.mark.parametrize("max_output", [0, 4097, -1])
def test_max_output_past_context_is_refused(max_output: int) -> None:
    err = refused(model(max_output=max_output), LLAMA_8B)
    assert err.field == "max_output"
    assert "4096" in str(err)


def test_max_output_up_to_context_is_kept() -> None:
    assert check_model(model(max_output=4096), LLAMA_8B).max_output == 4096


@pytest.mark.parametrize("slots", [0, -1, MAX_SLOTS + 1])
def test_slots_out_of_range_are_refused(slots: int) -> None:
    err = refused(model(slots=slots, context=256), TINY)
    assert err.field == "slots"
    assert str(MAX_SLOTS) in str(err)


def test_slots_at_the_bounds_are_kept() -> None:
    assert check_model(model(slots=1, context=256), TINY).slots == 1
    assert check_model(model(slots=MAX_SLOTS, context=256), TINY).slots == MAX_SLOTS


@pytest.mark.parametrize(
    ("engine", "args", "phrase"),
    [
        ("llama.cpp", ("-m", "/x.gguf"), "is not allowed"),
        ("vllm", ("--trust-remote",), "is not allowed"),
        ("sglang", ("--model=x",), "is not allowed"),
        ("llama.cpp", ("-c", "8192"), "llmgw ctl model context"),
        ("vllm", ("--max-model", "8192"), "llmgw ctl model context"),
        ("sglang", ("--max-running-requests", "2"), "llmgw ctl model context"),
    ],
)
def test_refused_and_managed_args_name_the_profile(
    engine: str, args: tuple[str, ...], phrase: str
) -> None:
    m = model(profile(name="gpu", engine=engine, args=args, cards=1), engine=engine)
    err = refused(m, LLAMA_8B)
    assert err.field == "profiles.gpu"
    assert phrase in str(err)
    assert repr(args[0]) in str(err)


def test_unknown_engine_is_refused_on_the_profile() -> None:
    err = refused(model(profile(engine="tgi")), LLAMA_8B)
    assert err.field == "profiles.cpu"
    assert "unknown engine" in str(err)


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"cards": -1}, "profiles.cpu.cards"),
        ({"engine": "vllm", "cards": 65}, "profiles.cpu.cards"),
        ({"replicas": -1}, "profiles.cpu.replicas"),
        ({"replicas": 10_001}, "profiles.cpu.replicas"),
        ({"cpu_cores": -0.5}, "profiles.cpu.cpu_cores"),
        ({"selector": {"zone": "a b"}}, "profiles.cpu.selector"),
        ({"selector": {"": "a"}}, "profiles.cpu.selector"),
    ],
)
def test_profile_figures_out_of_range_are_refused(
    overrides: dict[str, object], field_name: str
) -> None:
    assert refused(model(profile(**overrides)), LLAMA_8B).field == field_name


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_cards_must_split_the_kv_heads(engine: str) -> None:
    def on(cards: int) -> Model:
        return model(profile(name="gpu", engine=engine, cards=cards), engine=engine)

    err = refused(on(3), LLAMA_8B)
    assert err.field == "profiles.gpu.cards"
    assert "8 KV heads" in str(err)
    for cards in (1, 2, 4, 8, 16):
        kept = check_model(on(cards), LLAMA_8B)
        assert kept.profiles[0].cards == cards


def test_llama_cpp_splits_layers_over_any_number_of_cards() -> None:
    for cards in (2, 3, 8):  # 3 splits no KV heads evenly: layers, not tensors, are cut
        kept = check_model(model(profile(name="gpu", cards=cards)), LLAMA_8B)
        assert kept.profiles[0].cards == cards
    two = check_model(model(profile(name="gpu", cards=2)), LLAMA_8B).profiles[0]
    one = check_model(model(profile(name="gpu", cards=1)), LLAMA_8B).profiles[0]
    assert two.card_memory < one.card_memory  # each card holds about half the layers


def test_kv_events_are_for_vllm_and_reach_its_shards_alone() -> None:
    err = refused(model(kv_events=True), LLAMA_8B)
    assert err.field == "kv_events" and "--engine vllm" in str(err)
    vllm = profile(name="gpu", engine="vllm", cards=1)
    both = model(vllm, profile(), engine="vllm", source="hf:org/repo", kv_events=True)
    kept = check_model(both, LLAMA_8B)
    on_vllm = shard_spec(kept, kept.profiles[0], "r", 9000, ["GPU-1"], "k")
    on_llama = shard_spec(kept, kept.profiles[1], "r2", 9001, [], "k")
    assert on_vllm.kv_events and not on_llama.kv_events
    # Switching it on restarts vLLM's replicas (new flags), and no other.
    off = replace(kept, kv_events=False)
    assert fingerprint(off, vllm) != fingerprint(kept, vllm)
    assert fingerprint(off, kept.profiles[1]) == fingerprint(kept, kept.profiles[1])
    assert Model.from_spec(kept.to_spec()).kv_events is True


@pytest.mark.parametrize("cards", [0, 2])
def test_unknown_shape_needs_memory(cards: int) -> None:
    m = model(profile(engine="vllm", cards=cards), engine="vllm", source="hf:org/repo")
    err = refused(m, None)
    assert err.field == "memory"
    assert "--memory" in str(err)


def test_unknown_shape_with_memory_keeps_the_operators_figure() -> None:
    cpu = profile(memory=12 * GIB, memory_set=True)
    gpu = profile(name="gpu", engine="vllm", cards=3, memory=20 * GIB, memory_set=True)
    kept = check_model(model(cpu, gpu, source="hf:org/repo"), None)
    assert (kept.profiles[0].memory, kept.profiles[0].card_memory) == (12 * GIB, 0)
    # No shape: the KV heads are not known, so 3 cards are not refused.
    assert (kept.profiles[1].memory, kept.profiles[1].card_memory) == (20 * GIB, 20 * GIB)
    assert kept.shape == {}
    assert kept.weight_bytes == 0


def test_cpu_profile_memory_is_weights_kv_and_overhead() -> None:
    kept = check_model(model(context=4096, slots=2), LLAMA_8B)
    p = kept.profiles[0]
    kv = LLAMA_8B_KV_PER_TOKEN * 4096 * 2
    estimate = sizing.memory_estimate(LLAMA_8B, 4096, 2)
    assert estimate.kv_cache == kv
    assert p.memory == estimate.total == LLAMA_8B.file_bytes + kv + estimate.overhead
    # The overhead is the fixed part plus 5% of weights and KV (rounded within a byte).
    fixed = sizing.OVERHEAD_FIXED_BYTES
    assert abs(estimate.overhead - (fixed + 0.05 * (LLAMA_8B.file_bytes + kv))) <= 2
    assert p.card_memory == 0
    assert p.memory_set is False


def test_cpu_profile_memory_set_by_the_operator_is_kept() -> None:
    kept = check_model(model(profile(memory=20 * GIB, memory_set=True)), LLAMA_8B)
    assert kept.profiles[0].memory == 20 * GIB
    assert kept.profiles[0].card_memory == 0


def test_one_card_profile_holds_the_replica_on_its_card() -> None:
    kept = check_model(model(profile(name="gpu", cards=1), context=8192), LLAMA_8B)
    p = kept.profiles[0]
    assert p.card_memory == sizing.memory_estimate(LLAMA_8B, 8192, 1).total
    assert p.memory == CARD_HOST_MEMORY == GIB


def test_card_profile_memory_is_the_largest_per_card_share() -> None:
    gpu = profile(name="gpu", engine="vllm", cards=4)
    m = model(gpu, engine="vllm", source="hf:meta/Llama-3-8B", context=8192, slots=4)
    p = check_model(m, LLAMA_8B).profiles[0]
    estimate = sizing.memory_estimate(LLAMA_8B, 8192, 4, cards=4, split="tensor")
    assert p.card_memory == max(estimate.per_card)
    # A quarter of weights and KV, and each card's own overhead.
    whole = sizing.memory_estimate(LLAMA_8B, 8192, 4).total
    assert whole / 4 < p.card_memory < whole / 2
    assert p.memory == CARD_HOST_MEMORY


def test_card_profile_host_memory_given_is_kept() -> None:
    gpu = profile(name="gpu", engine="vllm", cards=2, memory=3 * GIB, memory_set=True)
    p = check_model(model(gpu, engine="vllm"), LLAMA_8B).profiles[0]
    assert p.memory == 3 * GIB
    assert p.card_memory == max(
        sizing.memory_estimate(LLAMA_8B, 4096, 1, cards=2, split="tensor").per_card
    )


def test_check_model_keeps_the_shape_and_weights() -> None:
    kept = check_model(model(), LLAMA_8B)
    assert kept.weight_bytes == LLAMA_8B.file_bytes
    assert kept.shape["kv_heads"] == 8
    assert kept.shape["trained_context"] == 8192
    # Figures not known are kept as null (not 0), so the shape can be built again.
    assert kept.shape["experts"] is None
    assert catalog.shape_of(kept) == LLAMA_8B


def test_a_safetensors_shape_round_trips_so_the_model_can_be_changed() -> None:
    shape = sizing.shape_from_config(
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 32,
            "max_position_embeddings": 8192,
        },
        16_000_000_000,
    )
    m = Model("llama-3-8b", "hf:meta/llama-3-8b", "vllm", (Profile("gpu", "vllm", cards=1),), 4096)
    kept = catalog.check_model(m, shape)
    assert catalog.shape_of(kept) == shape
    changed = catalog.check_model(replace(kept, context=2048), catalog.shape_of(kept))
    assert changed.profiles[0].card_memory < kept.profiles[0].card_memory


@pytest.mark.parametrize(
    ("source", "engine", "name"),
    [
        ("https://example.com/m/model.gguf?download=true", "llama.cpp", "model"),
        ("https://example.com/m/model.gguf?x=a/b", "llama.cpp", "model"),
        ("https://x.org/a/Model-Q4.gguf#frag", "llama.cpp", "model-q4"),
        ("hf:org/repo:sub/model.safetensors", "vllm", "repo"),
    ],
)
def test_urls_with_queries_and_files_in_repositories(source: str, engine: str, name: str) -> None:
    assert catalog.default_engine(source) == engine
    assert catalog.default_name(source) == name


def test_shape_of_round_trips_the_kept_shape() -> None:
    for shape in (LLAMA_8B, TINY):
        assert shape_of(check_model(model(context=256), shape)) == shape


def test_shape_of_without_a_kept_shape_is_none() -> None:
    assert shape_of(model()) is None
    assert shape_of(model(shape={"layers": 2})) is None  # too little to be a shape


def test_shape_of_ignores_keys_it_does_not_know() -> None:
    kept = check_model(model(), LLAMA_8B)
    extra = replace(kept, shape={**kept.shape, "later_field": 1})
    assert shape_of(extra) == LLAMA_8B


def test_a_kept_model_checks_again_with_its_kept_shape() -> None:
    kept = check_model(model(profile(name="gpu", cards=1)), LLAMA_8B)
    again = check_model(replace(kept, context=8192), shape_of(kept))
    assert again.profiles[0].card_memory > kept.profiles[0].card_memory


# ------------------------------------------------------------------ default context


def test_default_context_when_the_shape_does_not_say() -> None:
    assert default_context(None, 80 * GIB, 1) == DEFAULT_CONTEXT == 4096
    assert default_context(replace(LLAMA_8B, trained_context=None), None, 1) == 4096


def test_default_context_is_the_trained_context_when_it_fits() -> None:
    assert default_context(LLAMA_8B, None, 1) == 8192
    assert default_context(LLAMA_8B, 80 * GIB, 4) == 8192


def test_default_context_is_cut_to_the_largest_room() -> None:
    room = 6 * GIB
    got = default_context(LLAMA_8B, room, 1)
    assert got == sizing.max_context_that_fits(LLAMA_8B, room, 1)
    assert 256 <= got < 8192
    assert got % 256 == 0
    # What it gives fits; one more step would not.
    assert sizing.memory_estimate(LLAMA_8B, got, 1).total <= room
    assert sizing.memory_estimate(LLAMA_8B, got + 256, 1).total > room


def test_default_context_shrinks_with_slots() -> None:
    room = 4_920_000_000 + 3 * GIB
    one = default_context(LLAMA_8B, room, 1)
    four = default_context(LLAMA_8B, room, 4)
    assert one == 8192
    assert four < one
    assert sizing.memory_estimate(LLAMA_8B, four, 4).total <= room


# ----------------------------------------------------------------------- with change


def test_a_changed_profile_old_fingerprint_is_replaced() -> None:
    cpu, gpu = profile(), profile(name="gpu", cards=1, priority=5)
    old = model(cpu, gpu)
    new_gpu = replace(gpu, args=("--jinja",))
    changed = with_change(old, replace(old, profiles=(cpu, new_gpu)))
    assert changed.replaced == (fingerprint(old, gpu),)
    assert fingerprint(old, cpu) not in changed.replaced
    assert changed.profile("gpu") == new_gpu


def test_a_context_change_replaces_every_profile() -> None:
    cpu, gpu = profile(), profile(name="gpu", cards=1)
    old = model(cpu, gpu)
    changed = with_change(old, replace(old, context=8192))
    assert set(changed.replaced) == {fingerprint(old, cpu), fingerprint(old, gpu)}


@pytest.mark.parametrize(
    "change",
    [{"max_output": 100}, {"on_demand": True}],
)
def test_a_change_the_engine_never_sees_replaces_nothing(change: dict[str, object]) -> None:
    old = model(profile(), profile(name="gpu", cards=1))
    assert with_change(old, replace(old, **change)).replaced == ()  # type: ignore[arg-type]


def test_scaling_a_profile_replaces_nothing() -> None:
    p = profile()
    old = model(p)
    assert with_change(old, replace(old, profiles=(replace(p, replicas=4),))).replaced == ()


def test_earlier_replaced_fingerprints_are_kept() -> None:
    p = profile()
    old = model(p, replaced=("earlier",))
    changed = with_change(old, replace(old, restart=1))
    assert changed.replaced == ("earlier", fingerprint(old, p))
    # Changing back to a fingerprint already listed does not list it twice.
    again = with_change(old, replace(old, restart=1, replaced=changed.replaced))
    assert again.replaced.count(fingerprint(old, p)) == 1


def test_replaced_keeps_only_the_latest() -> None:
    p = profile()
    old = model(p, replaced=tuple(f"f{i}" for i in range(40)))
    changed = with_change(old, replace(old, restart=1))
    assert len(changed.replaced) == 33
    assert changed.replaced[0] == "f8"
    assert changed.replaced[-1] == fingerprint(old, p)


def test_a_new_profile_replaces_nothing() -> None:
    p = profile()
    old = model(p)
    changed = with_change(old, replace(old, profiles=(p, profile(name="gpu", cards=1))))
    assert changed.replaced == ()
