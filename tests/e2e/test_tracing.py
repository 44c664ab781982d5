"""Traces across the fleet, end to end: a real control plane and a real agent running
the built llama-server send their spans to an OTLP receiver in the test. A replica
start's spans from both arrive under one trace id (the agent's tracing set for every
node with `ctl config set`), a `/v1` request through the openai SDK arrives as a span
with its GenAI attributes, and the trace id is in the logs of both ends."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.e2e.catalog import ctl, ctl_json, join, scheduled, serve, wait_ready
from tests.e2e.cluster import wait_for
from tests.support.otlp import Received, receiver

pytestmark = pytest.mark.e2e


def test_a_replica_start_and_a_request_traced_across_control_plane_and_agent(
    tmp_path: Path, binary: Path, model: Path
) -> None:
    with receiver() as otlp:
        cluster = scheduled(tmp_path, f"tracing:\n  endpoint: {otlp.endpoint}\n")
        try:
            ctl(cluster, "config", "set", "tracing.endpoint", otlp.endpoint)
            join(cluster, "a", binary)

            def traces() -> bool:
                node = cluster.nodes()["a"]
                said = ((node.get("settings") or {}).get("values") or {}).get("tracing.endpoint")
                return node["state"] == "Ready" and said == {
                    "value": otlp.endpoint,
                    "source": "cluster",
                }

            # The agent starts itself again to run with it: the start must find it so.
            wait_for(traces, 30, "the agent to run with the cluster's tracing.endpoint")
            serve(cluster, model, "tiny", "--max-output", "8")
            wait_ready(cluster, "tiny", 1)

            def started(spans: list[Received]) -> tuple[Received, Received] | None:
                ours = [s for s in spans if s.name == "replica start"]
                sent = [s for s in ours if s.service == "llmgw-server"]
                for s in sent:
                    for t in ours:
                        if t.service == "llmgw-agent" and t.parent_id == s.span_id:
                            return s, t
                return None

            pair = otlp.wait(started, 30, "replica start from both ends")
            assert isinstance(pair, tuple)
            server_span, agent_span = pair
            trace_id = server_span.trace_id
            assert agent_span.trace_id == trace_id and agent_span.instance == "a"
            (reconcile,) = [s for s in otlp.named("reconcile") if s.trace_id == trace_id]
            assert server_span.parent_id == reconcile.span_id and reconcile.parent_id == ""

            def steps(spans: list[Received]) -> set[str] | None:
                found = {
                    s.name
                    for s in spans
                    if s.trace_id == trace_id and s.parent_id == agent_span.span_id
                }
                return found if {"fetch", "engine start", "ready"} <= found else None

            assert otlp.wait(steps, 30, "the agent's steps")

            key = ctl_json(cluster, "keys", "create", "--name", "tracer")["key"]
            sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0)
            with sdk:
                answer = sdk.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hello"}]
                )
            assert answer.usage is not None

            def chat(spans: list[Received]) -> Received | None:
                return next((s for s in spans if s.name == "chat tiny"), None)

            span = otlp.wait(chat, 30, "the request's span")
            assert isinstance(span, Received)
            a = span.attributes
            assert a["gen_ai.operation.name"] == "chat"
            assert a["gen_ai.request.model"] == "tiny"
            assert a["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
            assert a["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
            assert (
                a["llmgw.node"] == "a"
                and a["llmgw.replica"] == agent_span.attributes["llmgw.replica"]
            )
            assert a["llmgw.engine"] == "llama.cpp" and a["http.response.status_code"] == 200
            assert isinstance(a["llmgw.time_to_first_token"], float)
            # The trace id in the logs of both ends.
            assert f"trace_id={trace_id}" in (tmp_path / "server.log").read_text()
            assert f"trace_id={trace_id}" in (tmp_path / "agent-a.log").read_text()
        finally:
            cluster.stop()
