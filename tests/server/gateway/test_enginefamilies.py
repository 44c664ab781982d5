"""The engines' metric families renamed to Prometheus's rules: real llama.cpp text, vLLM's
and SGLang's shapes (tests/fixtures/engines), checked by the real ``promtool``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw.enginefamilies import (
    RENAMES,
    EngineFamilies,
    Kind,
    prometheus_name,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "engines"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "telemetry.md"
CAPTURES = ("llamacpp-0c1e570.metrics", "vllm-shape.metrics", "sglang-docs.metrics")
# A model name with every character the text format escapes.
ODD = 'a"b\\c\nd'
ODD_ESCAPED = 'a\\"b\\\\c\\nd'


def promtool_check(text: str) -> tuple[int, str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    return checked.returncode, checked.stdout + checked.stderr


def renamed(*texts: str) -> str:
    families = EngineFamilies()
    for i, text in enumerate(texts):
        families.add(text, ODD if i == 0 else "m", f"m.default.{i}")
    return "\n".join(families.lines()) + "\n"


def family_names(text: str) -> list[str]:
    return re.findall(r"^# TYPE (\S+) ", text, re.M)


@pytest.mark.parametrize("capture", CAPTURES)
def test_each_engines_text_passes_promtool_once_renamed(capture: str) -> None:
    text = (FIXTURES / capture).read_text()
    # As the engine writes it, promtool refuses it (the colons, at the least) ...
    code, said = promtool_check(text)
    assert code != 0 and "should not contain ':'" in said
    # ... and from three replicas, renamed, it is clean: nothing printed.
    out = renamed(text, text, text)
    assert promtool_check(out) == (0, "")
    assert ":" not in "".join(re.findall(r"^[^#{ ]+", out, re.M))
    names = family_names(out)
    assert len(names) == len(set(names)) == len(family_names(text))


def test_the_real_llamacpp_families_are_the_tables() -> None:
    text = (FIXTURES / "llamacpp-0c1e570.metrics").read_text()
    out = renamed(text)
    ours = {r.ours for r in RENAMES if r.engine == "llama.cpp"}
    assert set(family_names(out)) == ours and len(ours) == 15
    assert "# TYPE llamacpp_n_decode_total counter" in out
    # llama.cpp's counter without _total gets it, its figure kept.
    assert "# TYPE llamacpp_n_tokens_max_total counter" in out
    assert f'llamacpp_n_tokens_max_total{{model="{ODD_ESCAPED}",replica="m.default.0"}} 7' in out
    assert "# HELP llamacpp_n_decode_total Total number of llama_decode() calls, excluding " in out


def test_histograms_keep_their_samples_and_lose_a_wrong_total() -> None:
    out = renamed((FIXTURES / "vllm-shape.metrics").read_text())
    assert "# TYPE vllm_iteration_tokens histogram" in out
    labels = f'model="{ODD_ESCAPED}",replica="m.default.0",engine="0"'
    assert (
        f'vllm_iteration_tokens_bucket{{{labels},le="+Inf",model_name="Qwen/Qwen3-0.6B"}} 64.0'
    ) in out
    assert f'vllm_iteration_tokens_count{{{labels},model_name="Qwen/Qwen3-0.6B"}} 64.0' in out
    # prometheus_client's _created gauges are families of their own, renamed alike.
    assert "# TYPE vllm_iteration_tokens_total_created gauge" in out
    assert "# TYPE vllm_prompt_tokens_created gauge" in out
    # The default registry's families already follow the rules: kept as they are.
    assert "# TYPE process_cpu_seconds_total counter" in out
    sglang = renamed((FIXTURES / "sglang-docs.metrics").read_text())
    assert (
        'sglang_time_to_first_token_seconds_bucket{model="a\\"b\\\\c\\nd",replica="m.default.0",'
        'le="0.04",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0'
    ) in sglang


@pytest.mark.parametrize(
    ("name", "kind", "ours"),
    [
        ("llamacpp:n_decode_total", "counter", "llamacpp_n_decode_total"),
        ("llamacpp:n_tokens_max", "counter", "llamacpp_n_tokens_max_total"),
        ("llamacpp:requests_processing", "gauge", "llamacpp_requests_processing"),
        ("vllm:iteration_tokens_total", "histogram", "vllm_iteration_tokens"),
        ("vllm:cache_config_info", "gauge", "vllm_cache_config_info"),
        ("sglang:prompt_tokens_total", "counter", "sglang_prompt_tokens_total"),
        ("odd.name-9", "untyped", "odd_name_9"),
        ("x:y_total", "untyped", "x_y_total"),
        ("9lives", "gauge", "_9lives"),
    ],
)
def test_the_rule(name: str, kind: Kind, ours: str) -> None:
    assert prometheus_name(name, kind) == ours


def test_the_table_follows_the_rule_and_the_docs_show_it() -> None:
    engines = {r.name for r in RENAMES}
    assert len(engines) == len(RENAMES) and {r.engine for r in RENAMES} == {
        "llama.cpp",
        "vLLM",
        "SGLang",
    }
    for r in RENAMES:
        assert r.ours == prometheus_name(r.name, r.kind)
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", r.ours), r
    rows = re.findall(r"^\| (llama\.cpp|vLLM|SGLang) \| `([^`]+)` \| (\w+) \| `([^`]+)` \|$",
                      DOCS.read_text(), re.M)  # fmt: skip
    assert rows == [(r.engine, r.name, r.kind, r.ours) for r in RENAMES]


def test_labels_are_parsed_and_escaped_and_ours_come_first() -> None:
    text = (
        # A backslash before anything but n, \\ or " is kept as a backslash.
        "# HELP e:info An engine's facts\\nin C:\\\\x or C:\\y.\n# TYPE e:info gauge\n"
        'e:info{model="its own",path="C:\\\\models\\\\x}, y",quote="say \\"hi\\"",} 1\n'
        'e:info{replica="r0",replica="dup",raw="a\\qb"} 1 1700000000000\n'
        # Not samples: the gateway leaves them out rather than write what promtool refuses.
        'e:info{broken="no end} 1\n'
        "e:info{x=unquoted} 1\n"
        "e:info not_a_number\n"
        "e:info 1_000\n"
        "e:info-1 2\n"
        "e:info 1 2 3\n"
        "e:info 1 2.5\n"
        "# a comment\n"
        "e:info\n"
    )
    out = renamed(text, text)
    assert out.splitlines() == [
        "# HELP e_info An engine's facts\\nin C:\\\\x or C:\\\\y. (named e:info by the engine)",
        "# TYPE e_info gauge",
        f'e_info{{model="{ODD_ESCAPED}",replica="m.default.0",exported_model="its own",'
        'path="C:\\\\models\\\\x}, y",quote="say \\"hi\\""} 1',
        f'e_info{{model="{ODD_ESCAPED}",replica="m.default.0",exported_replica="r0",'
        'raw="a\\\\qb"} 1 1700000000000',
        'e_info{model="m",replica="m.default.1",exported_model="its own",'
        'path="C:\\\\models\\\\x}, y",quote="say \\"hi\\""} 1',
        'e_info{model="m",replica="m.default.1",exported_replica="r0",raw="a\\\\qb"} '
        "1 1700000000000",
    ]
    assert promtool_check(out) == (0, "")


def test_names_that_are_taken_are_left_out() -> None:
    first = (
        "# HELP llmgw_requests_total Not ours.\n# TYPE llmgw_requests_total counter\n"
        "llmgw_requests_total 5\n"
        "# HELP e:load Load.\n# TYPE e:load gauge\ne:load 1\n"
        # Two of one engine's families that would share a name: the first keeps it.
        "# HELP e:x_total X.\n# TYPE e:x_total counter\ne:x_total 3\n"
        "# HELP e:x X again.\n# TYPE e:x counter\ne:x 4\n"
    )
    # Another replica's engine says e:load is a summary: not written under the gauge.
    second = "# HELP e:load Load.\n# TYPE e:load summary\ne:load_sum 9\ne:load_count 1\n"
    out = renamed(first, second)
    assert "llmgw_requests_total" not in out
    assert 'e_load{model="a' in out and "m.default.1" not in out
    assert 'e_x_total{model="a' in out and not re.search(" 4$", out, re.M)
    assert family_names(out) == ["e_load", "e_x_total"]
    assert promtool_check(out) == (0, "")
