"""``/api/v1/models/{name}/adapters`` on the real admin app, in process: listed, added and
removed as plain fields, refusals in the API's shape, the model's view showing them, and
the OpenAPI document naming every name a request may give."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from llmgw.server.app import ControlPlane
from tests.support.tinymodel import write_tiny_model


@pytest.fixture
async def api(tmp_path: Path, plane: tuple[ControlPlane, httpx.AsyncClient]) -> httpx.AsyncClient:
    _, client = plane
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    served = await client.post(
        "/api/v1/models", json={"source": str(tiny), "name": "tiny", "context": 256}
    )
    assert served.status_code == 201, served.text
    return client


async def test_adapters_are_listed_added_and_removed(api: httpx.AsyncClient) -> None:
    path = "/api/v1/models/tiny/adapters"
    assert (await api.get(path)).json() == []
    added = await api.post(path, json={"name": "sql", "source": "/loras/sql.gguf", "scale": 0.5})
    assert added.status_code == 201
    assert added.json() == [{"name": "sql", "source": "/loras/sql.gguf", "scale": 0.5}]
    await api.post(path, json={"name": "chat", "source": "hf:org/chat:chat.gguf"})
    listed = (await api.get(path)).json()
    assert listed == [
        {"name": "sql", "source": "/loras/sql.gguf", "scale": 0.5},
        {"name": "chat", "source": "hf:org/chat:chat.gguf", "scale": 1.0},
    ]
    shown = (await api.get("/api/v1/models/tiny")).json()
    assert shown["adapters"] == listed
    # Every name a request may give is in the /v1 document.
    document = (await api.get("/api/v1/openapi.json")).json()
    assert "tiny:sql" in str(document) and "'chat'" in str(document)
    removed = await api.delete(f"{path}/sql")
    assert removed.status_code == 200 and [a["name"] for a in removed.json()] == ["chat"]


async def test_refusals_name_the_field(api: httpx.AsyncClient) -> None:
    path = "/api/v1/models/tiny/adapters"
    await api.post(path, json={"name": "sql", "source": "/loras/sql.gguf"})
    for body, status, field in (
        ({"name": "tiny", "source": "/x.gguf"}, 409, "name"),
        ({"name": "sql", "source": "/x.gguf"}, 409, "name"),
        ({"name": "bad:name", "source": "/x.gguf"}, 400, "name"),
        ({"name": "p", "source": "/loras/adapter.bin"}, 400, "source"),
        ({"name": "s", "source": "/x.gguf", "scale": 1000}, 400, "scale"),
        ({"name": "s"}, 400, "source"),
    ):
        answer = await api.post(path, json=body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["error"]["param"] == field, body
    missing = await api.delete(f"{path}/nope")
    assert missing.status_code == 404 and "has no adapter 'nope'" in missing.text
    assert (await api.get("/api/v1/models/none/adapters")).status_code == 404
    # A model may not be served under an adapter's name.
    clash = await api.post("/api/v1/models", json={"source": "/x.gguf", "name": "sql"})
    assert clash.status_code == 409 and "adapter of tiny" in clash.text
