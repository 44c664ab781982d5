"""The admin client's routes: the path each call asks for and the body it sends. Which
shape each answer is read as is held against a real admin app in
tests/server/api/test_answer_shapes.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from llmgw.client.admin import AdminClient
from llmgw.client.routes import LOGS, MODEL


class Recorder(AdminClient):
    """Every call kept; each answered with ``answer``."""

    def __init__(self, answer: Any = None) -> None:
        super().__init__("http://cp", "t")
        self.answer = answer
        self.asked: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.asked.append((method, path, body))
        return self.answer

    def stream(self, path: str) -> Iterator[object]:
        self.asked.append(("STREAM", path, None))
        yield ["one", "two"]
        yield {"error": "the shard stopped"}


def test_a_route_quotes_each_part_and_encodes_its_query() -> None:
    assert MODEL.at("org/model:Q4") == "/api/v1/models/org%2Fmodel%3AQ4"
    assert LOGS.at("n1", query={"source": "agent", "n": 5}) == (
        "/api/v1/nodes/n1/logs?source=agent&n=5"
    )
    assert MODEL.at("m", query={}) == "/api/v1/models/m"


def test_each_call_asks_its_route_with_its_body() -> None:
    admin = Recorder()
    admin.change_model("m", "stop")
    admin.change_model("m", "context", {"context": 4096})
    admin.remove_model("m", with_files=True)
    admin.weights("n1")
    admin.collect()
    admin.setting("discovery.slow_interval", "n1")
    admin.history("n1", 30.0)
    assert admin.asked == [
        # A POST without a body sends an empty object, as the routes expect.
        ("POST", "/api/v1/models/m/stop", {}),
        ("POST", "/api/v1/models/m/context", {"context": 4096}),
        ("DELETE", "/api/v1/models/m?with_files=1", None),
        ("GET", "/api/v1/weights?node=n1", None),
        ("POST", "/api/v1/weights/collect", {}),
        ("GET", "/api/v1/config?key=discovery.slow_interval&node=n1", None),
        ("GET", "/api/v1/nodes/n1/history?minutes=30", None),
    ]


def test_a_followed_log_is_read_batch_by_batch() -> None:
    admin = Recorder()
    batches = list(admin.follow_logs("n1", "r1", 20))
    assert batches == [["one", "two"], {"error": "the shard stopped"}]
    assert admin.asked == [("STREAM", "/api/v1/nodes/n1/logs?source=r1&n=20&follow=1", None)]
