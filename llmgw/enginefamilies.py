"""The engines' own metric families, renamed to Prometheus's rules for ``/metrics``:
the control plane's (every Ready replica's) and each agent's own (its node's replicas).

llama.cpp, vLLM and SGLang name their families with a colon (``llamacpp:n_decode_total``),
and llama.cpp declares counters without ``_total``; ``promtool check metrics`` refuses
both. Each family an engine exports is written on ``/metrics`` under its Prometheus
name, worked out by one rule (``prometheus_name``):

1. every character other than a letter, digit or ``_`` becomes ``_`` (so the colon),
   and a name that would start with a digit gets a leading ``_``;
2. a counter ends with ``_total`` (added when missing);
3. a family that is not a counter does not (vLLM's histogram
   ``vllm:iteration_tokens_total`` is ``vllm_iteration_tokens``).

``RENAMES`` is the table of the families we know from each engine, as docs/telemetry.md
shows it; families not in it (a newer engine's) go through the same rule.

``EngineFamilies`` gathers every replica's text: each sample gets ``model`` and
``replica`` labels first (an engine's own label of those names is kept as
``exported_model`` / ``exported_replica``, as Prometheus does), label values are
escaped again, each family is written once with its HELP and TYPE and all its samples
together, a family without HELP gets one naming where it came from, and a family whose
name is taken (by ours, ``llmgw_*``, or by another of a different type) is left out.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Final, Literal, cast

import aiohttp

Kind = Literal["counter", "gauge", "histogram", "summary", "untyped"]
KINDS: Final = ("counter", "gauge", "histogram", "summary", "untyped")

# The samples a family of each kind writes besides its own name.
_SUFFIXES: Final[dict[str, tuple[str, ...]]] = {
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "counter": ("_total",),
}
_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL: Final = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_NOT_NAME: Final = re.compile(r"[^a-zA-Z0-9_]")
_UNESCAPE: Final = re.compile(r"\\(.)")
_ESCAPES: Final = {"n": "\n", "\\": "\\", '"': '"'}
_VALUE: Final = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?Inf|NaN")
# Our own labels, written first on every engine sample.
_OURS: Final = ("model", "replica")


@dataclass(frozen=True)
class Rename:
    engine: str  # who exports it: llama.cpp, vLLM, SGLang
    name: str  # the engine's family name
    kind: Kind
    ours: str  # its name on /metrics


def prometheus_name(name: str, kind: Kind) -> str:
    """An engine's family name as Prometheus's rules want it (the rule above)."""
    out = _NOT_NAME.sub("_", name)
    if out[:1].isdigit():
        out = "_" + out
    if kind == "counter" and not out.endswith("_total"):
        out += "_total"
    elif kind not in ("counter", "untyped") and out.endswith("_total"):
        out = out.removesuffix("_total")
    return out


def _table(engine: str, families: str) -> tuple[Rename, ...]:
    rows = []
    for line in families.split():
        name, kind = line.rsplit("/", 1)
        assert kind in KINDS, line
        typed = cast(Kind, kind)
        rows.append(Rename(engine, name, typed, prometheus_name(name, typed)))
    return tuple(rows)


# llama.cpp's from its server's /metrics (build 0c1e570, tests/fixtures/engines);
# vLLM's as its v0.10 docs list them (its counters' and histograms' ``_created``
# gauges, written by prometheus_client, follow the rule too); SGLang's as its docs do.
RENAMES: Final[tuple[Rename, ...]] = (
    *_table(
        "llama.cpp",
        """
        llamacpp:prompt_tokens_total/counter llamacpp:prompt_tokens_cached_total/counter
        llamacpp:prompt_seconds_total/counter llamacpp:tokens_predicted_total/counter
        llamacpp:tokens_predicted_seconds_total/counter llamacpp:n_decode_total/counter
        llamacpp:n_tokens_max/counter llamacpp:spec_decode_num_draft_tokens_total/counter
        llamacpp:spec_decode_num_accepted_tokens_total/counter
        llamacpp:spec_decode_num_drafts_total/counter llamacpp:prompt_tokens_seconds/gauge
        llamacpp:predicted_tokens_seconds/gauge llamacpp:requests_processing/gauge
        llamacpp:requests_deferred/gauge llamacpp:n_busy_slots_per_decode/gauge
        """,
    ),
    *_table(
        "vLLM",
        """
        vllm:num_requests_running/gauge vllm:num_requests_waiting/gauge
        vllm:kv_cache_usage_perc/gauge vllm:gpu_cache_usage_perc/gauge
        vllm:num_preemptions_total/counter vllm:prompt_tokens_total/counter
        vllm:generation_tokens_total/counter vllm:request_success_total/counter
        vllm:prefix_cache_queries_total/counter vllm:prefix_cache_hits_total/counter
        vllm:time_to_first_token_seconds/histogram vllm:inter_token_latency_seconds/histogram
        vllm:time_per_output_token_seconds/histogram vllm:e2e_request_latency_seconds/histogram
        vllm:request_queue_time_seconds/histogram vllm:request_prefill_time_seconds/histogram
        vllm:request_decode_time_seconds/histogram vllm:request_inference_time_seconds/histogram
        vllm:request_prompt_tokens/histogram vllm:request_generation_tokens/histogram
        vllm:iteration_tokens_total/histogram vllm:request_params_n/histogram
        vllm:request_params_max_tokens/histogram vllm:cache_config_info/gauge
        """,
    ),
    *_table(
        "SGLang",
        """
        sglang:prompt_tokens_total/counter sglang:generation_tokens_total/counter
        sglang:cached_tokens_total/counter sglang:num_requests_total/counter
        sglang:num_aborted_requests_total/counter sglang:token_usage/gauge
        sglang:cache_hit_rate/gauge sglang:num_running_reqs/gauge sglang:num_queue_reqs/gauge
        sglang:num_used_tokens/gauge sglang:gen_throughput/gauge
        sglang:time_to_first_token_seconds/histogram
        sglang:inter_token_latency_seconds/histogram
        sglang:e2e_request_latency_seconds/histogram
        """,
    ),
)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _esc_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _unescape(text: str) -> str:
    """The text format's escapes undone; a backslash before anything else is kept."""
    return _UNESCAPE.sub(lambda e: _ESCAPES.get(e[1], e[0]), text)


def _labels(text: str) -> list[tuple[str, str]] | None:
    """The pairs of ``{a="x",b="y"}`` (values unescaped), or None when it does not parse."""
    pairs: list[tuple[str, str]] = []
    at = 1
    while True:
        m = _LABEL.match(text, at)
        if m is None:
            # The end: ``}``, after the last pair's comma or none.
            return pairs if text[at:].strip() == "}" else None
        pairs.append((m[1], _unescape(m[2])))
        at = m.end()
        if m[3] == "}":
            return pairs if not text[at:].strip() else None


@dataclass
class _Family:
    name: str  # the engine's
    kind: Kind = "untyped"
    help: str | None = None
    ours: str = ""
    samples: list[str] = field(default_factory=list)

    def owns(self, sample: str) -> str | None:
        """The suffix ``sample`` (a sample's name) has as one of this family's, or None."""
        if sample == self.name:
            return ""
        for suffix in _SUFFIXES.get(self.kind, ()):
            if sample == self.name + suffix:
                return suffix
        return None


class EngineFamilies:
    """Every replica's engine families, renamed, merged by name across replicas."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}  # by our name, in the order first seen

    def add(self, text: str, model: str, replica: str) -> None:
        """One replica's ``/metrics`` text (Prometheus text 0.0.4)."""
        ours = f'model="{_esc(model)}",replica="{_esc(replica)}"'
        declared: dict[str, _Family] = {}  # this text's, by the engine's name
        claimed: dict[str, str] = {}  # this text's: our name -> the engine's
        current: _Family | None = None
        for line in text.splitlines():
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                    continue  # a comment
                current = declared.setdefault(parts[2], _Family(parts[2]))
                rest = parts[3].strip() if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    current.help = _esc_help(_unescape(rest))
                elif rest in KINDS:
                    current.kind = cast(Kind, rest)
                continue
            sample = _sample_of(line)
            if sample is None:
                continue  # blank, or not a sample the text format allows
            name, pairs, value = sample
            family = current
            suffix = family.owns(name) if family is not None else None
            if family is None or suffix is None:
                family = declared.setdefault(name, _Family(name))
                suffix = family.owns(name)
                if suffix is None:
                    continue
            if not family.ours:
                family.ours = prometheus_name(family.name, family.kind)
            if claimed.setdefault(family.ours, family.name) != family.name:
                continue  # two of this engine's families would have one name
            self._sample(family, suffix, ours, pairs, value)

    def _sample(
        self, family: _Family, suffix: str, ours: str, pairs: list[tuple[str, str]], value: str
    ) -> None:
        kept = self.families.get(family.ours)
        if kept is None:
            if family.ours.startswith("llmgw_"):
                return  # our own families' names are ours
            kept = self.families[family.ours] = _Family(
                family.name, family.kind, family.help, family.ours
            )
        elif kept.kind != family.kind:
            return  # the name is another family's, of another type
        kept.help = kept.help or family.help
        seen = set(_OURS)
        labels = [ours]
        for key, val in pairs:
            key = f"exported_{key}" if key in _OURS else key
            if key not in seen:
                seen.add(key)
                labels.append(f'{key}="{_esc(val)}"')
        # A counter's sample is the family's name itself (``_total`` added or not).
        sample = family.ours + ("" if family.kind == "counter" else suffix)
        kept.samples.append(f"{sample}{{{','.join(labels)}}} {value}")

    def lines(self) -> list[str]:
        """HELP, TYPE and the samples of each family, in the order first seen."""
        out: list[str] = []
        for f in self.families.values():
            said = f.help or "The engine gave no help text."
            if f.ours != f.name:
                said += f" (named {f.name} by the engine)"
            out += [f"# HELP {f.ours} {said}", f"# TYPE {f.ours} {f.kind}", *f.samples]
        return out


def _sample_of(line: str) -> tuple[str, list[tuple[str, str]], str] | None:
    """A sample line's name, label pairs and value (with its timestamp, if it has one),
    or None when it is not one."""
    m = _NAME.match(line)
    if m is None:
        return None
    name, after = m[0], line[m.end() :]
    pairs: list[tuple[str, str]] = []
    if after.startswith("{"):
        close = _labels_end(after)
        parsed = _labels(after[:close]) if close else None
        if parsed is None:
            return None
        pairs, after = parsed, after[close:]
    elif not after[:1].isspace():
        return None
    value = after.split()
    if not 1 <= len(value) <= 2 or _VALUE.fullmatch(value[0]) is None:
        return None
    if len(value) == 2 and re.fullmatch(r"-?[0-9]+", value[1]) is None:
        return None
    return name, pairs, " ".join(value)


def _labels_end(text: str) -> int:
    """Where the label set ``text`` starts with ends (past its ``}``), or 0 if it does not."""
    quoted = escaped = False
    for i, c in enumerate(text):
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = quoted
        elif c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return i + 1
    return 0


async def scrape(
    session: aiohttp.ClientSession, targets: list[tuple[str, str, str, str]]
) -> list[str]:
    """(model, replica, url, key) of each Ready replica: its /metrics, relabelled and
    renamed to Prometheus's rules, each family once. An engine that does not answer in
    2 s is left out of this scrape."""

    async def one(url: str, key: str) -> str | None:
        try:
            async with session.get(
                url,
                headers={"Authorization": f"Bearer {key}"},
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    texts = await asyncio.gather(*(one(url, key) for _, _, url, key in targets))
    families = EngineFamilies()
    for (model, replica, _, _), text in zip(targets, texts, strict=True):
        if text:
            families.add(text, model, replica)
    return families.lines()
