"""``/api/v1/openapi.json`` as ``llmgw.server.api.openapi.document`` writes it for a few
``Op``s declared here: their paths, operationIds, parameters, request schemas (from the
typed requests ``schema.read`` reads) and error answers, and the ``/v1`` gateway's
routes. The whole document is held to OpenAPI 3.1's own JSON Schema (the copy
schemathesis ships), and each schema in it to JSON Schema 2020-12."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31

from llmgw import __version__
from llmgw.server import schema
from llmgw.server.api.openapi import WHY, document
from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.gateway.checks import MAX_N, ROLES, Bounds
from llmgw.server.schema import spec

NAME = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class CreateThing:
    """A thing to make, by its name."""

    name: str = spec(doc="its name", pattern=NAME, max_length=32)
    size: int | None = spec(None, minimum=1, maximum=10)
    kind: Literal["small", "large"] = "small"
    tags: tuple[str, ...] = spec((), max_items=4)


@dataclass(frozen=True)
class Listing:
    limit: int = spec(minimum=1, maximum=100)
    node: str | None = spec(None, doc="only this node's")


async def _never(call: Call[Any, Any]) -> object:
    raise AssertionError("the document never calls a handler")


OPS: Ops = [
    Op("GET", "/healthz", _never, "Whether it works", access="public"),
    Op("GET", "/api/v1/things", _never, "Every thing", query=Listing),
    Op("POST", "/api/v1/things", _never, "Make a thing", body=CreateThing, status=201),
    Op("GET", "/api/v1/things/{name}", _never, "One thing", errors=(404,)),
    Op("DELETE", "/api/v1/things/{name}", _never, "Remove a thing", errors=(404, 409)),
    Op(
        "POST",
        "/api/v1/things/{name:path}/stop",
        _never,
        "Stop a thing",
        body=CreateThing,
        body_optional=True,
        errors=(422,),
    ),
    Op("GET", "/metrics", _never, "Prometheus text", access="public", media="text/plain"),
    # The console's pages: not API, so not in the document.
    Op("GET", "/admin", _never, "The console", access="public", media="text/html"),
    Op("GET", "/admin/{rest:path}", _never, "A page", access="public", media="text/html"),
]


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return document(OPS, Bounds(max_messages=50), ["m1", "m2"])


def test_the_document_is_openapi_3_1(doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] == "llmgw" and doc["info"]["version"] == __version__


def test_a_broken_document_is_caught_by_the_same_check(doc: dict[str, Any]) -> None:
    # The check above has teeth: an answer without its description is refused.
    broken = {**doc, "paths": {"/x": {"get": {"responses": {"200": {}}}}}}
    errors = list(jsonschema.Draft202012Validator(OPENAPI_31).iter_errors(broken))
    assert errors


def _schemas(node: object) -> list[dict[str, Any]]:
    """Every JSON Schema in the document: under "schema" and the components."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "schema" and isinstance(value, dict):
                found.append(value)
            elif key == "schemas" and isinstance(value, dict):
                found.extend(value.values())
            else:
                found.extend(_schemas(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_schemas(value))
    return found


def test_every_schema_in_it_is_json_schema_2020_12_and_each_ref_is_there(
    doc: dict[str, Any],
) -> None:
    schemas = _schemas(doc)
    assert len(schemas) > 20
    for found in schemas:
        jsonschema.Draft202012Validator.check_schema(found)
    refs = set(re.findall(r"'\$ref': '([^']+)'", str(doc)))
    assert refs == {"#/components/schemas/Error", "#/components/schemas/OpenAIError"}
    for ref in refs:
        assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"]


def test_each_op_is_under_its_path_with_converters_dropped_and_pages_left_out(
    doc: dict[str, Any],
) -> None:
    admin = {p: sorted(ops) for p, ops in doc["paths"].items() if not p.startswith("/v1/")}
    assert admin == {
        "/healthz": ["get"],
        "/api/v1/things": ["get", "post"],
        "/api/v1/things/{name}": ["delete", "get"],
        "/api/v1/things/{name}/stop": ["post"],
        "/metrics": ["get"],
    }


def test_operation_ids_are_method_and_path_words_and_unique(doc: dict[str, Any]) -> None:
    ids = {
        (path, method): op["operationId"]
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    }
    assert ids[("/api/v1/things", "get")] == "get_things"
    assert ids[("/api/v1/things", "post")] == "post_things"
    assert ids[("/api/v1/things/{name}", "delete")] == "delete_things_name"
    assert ids[("/api/v1/things/{name}/stop", "post")] == "post_things_name_stop"
    assert ids[("/healthz", "get")] == "get_healthz"
    assert ids[("/v1/chat/completions", "post")] == "v1_chat"
    assert len(set(ids.values())) == len(ids)
    assert doc["paths"]["/api/v1/things"]["post"]["summary"] == "Make a thing"


def test_path_parameters_are_required_bounded_strings(doc: dict[str, Any]) -> None:
    for path in ("/api/v1/things/{name}", "/api/v1/things/{name}/stop"):
        for op in doc["paths"][path].values():
            assert op["parameters"] == [
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "maxLength": 256},
                }
            ]
    assert "parameters" not in doc["paths"]["/healthz"]["get"]


def test_query_parameters_come_from_the_typed_query_and_are_never_null(
    doc: dict[str, Any],
) -> None:
    limit, node = doc["paths"]["/api/v1/things"]["get"]["parameters"]
    assert (node["name"], node["in"], node["required"]) == ("node", "query", False)
    assert node["schema"]["type"] == "string"  # str | None: the null branch dropped
    assert node["schema"]["description"] == "only this node's"
    assert (limit["name"], limit["required"]) == ("limit", True)
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 100}


def test_a_body_is_the_typed_requests_json_schema(doc: dict[str, Any]) -> None:
    made = doc["paths"]["/api/v1/things"]["post"]["requestBody"]
    assert made["required"] is True
    body = made["content"]["application/json"]["schema"]
    assert body == schema.json_schema(CreateThing)
    assert body["required"] == ["name"] and body["additionalProperties"] is False
    assert body["description"] == "A thing to make, by its name."
    assert body["properties"]["kind"] == {"type": "string", "enum": ["small", "large"]}
    optional = doc["paths"]["/api/v1/things/{name}/stop"]["post"]["requestBody"]
    assert optional["required"] is False
    assert "requestBody" not in doc["paths"]["/api/v1/things/{name}"]["delete"]


@pytest.mark.parametrize(
    "body",
    [
        {"name": "gpu-box"},
        {"name": "a", "size": 10, "kind": "large", "tags": ["x", "y"]},
        {"name": "a", "size": None},
        {"Name": "a"},
        {"name": "a", "colour": "red"},
        {"name": "Not-Lower"},
        {"name": "a" * 33},
        {"name": "a", "size": 0},
        {"name": "a", "kind": "medium"},
        {"name": "a", "tags": ["1", "2", "3", "4", "5"]},
        {"name": "a\u0000b"},
        {"name": "a", "tags": ["a\ud800"]},
        {"name": "a", "size": 5.0},
        {"name": "a", "size": True},
        {"name": "a", "size": "5"},
        {"name": "a", "size": 2**60},
        {"name": "a", "tags": "x"},
        {"name": "a", "tags": None},
        {"name": "a", "kind": None},
        # Not "a\n": ECMA's "$" (the document's dialect) ends the text, but the Python
        # validator used here reads it as Python's "$", which also matches before a
        # final newline.
    ],
)
def test_the_schema_takes_the_bodies_the_route_reads_and_refuses_the_rest(
    body: dict[str, Any], doc: dict[str, Any]
) -> None:
    documented = doc["paths"]["/api/v1/things"]["post"]["requestBody"]["content"]
    validator = jsonschema.Draft202012Validator(documented["application/json"]["schema"])
    try:
        schema.read(CreateThing, body)
        read = True
    except schema.Invalid:
        read = False
    assert validator.is_valid(body) is read


def test_each_op_names_the_errors_it_may_answer(doc: dict[str, Any]) -> None:
    def codes(path: str, method: str) -> list[str]:
        return list(doc["paths"][path][method]["responses"])

    # Its success first, then its errors in order.
    assert codes("/healthz", "get") == ["200"]  # public, no input
    assert codes("/api/v1/things", "get") == ["200", "400", "401", "403"]  # a query
    assert codes("/api/v1/things", "post") == ["201", "400", "401", "403", "408", "413", "503"]
    assert codes("/api/v1/things/{name}", "get") == ["200", "401", "403", "404"]
    assert codes("/api/v1/things/{name}", "delete") == ["200", "401", "403", "404", "409", "503"]
    stop = codes("/api/v1/things/{name}/stop", "post")
    assert stop == ["200", "400", "401", "403", "408", "413", "422", "503"]

    responses = doc["paths"]["/api/v1/things/{name}/stop"]["post"]["responses"]
    for code, answer in responses.items():
        if code == "200":
            continue
        assert answer["description"] == WHY.get(int(code), "Refused")
        assert answer["content"] == {
            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
    assert responses["422"]["description"] == "Refused"  # a code WHY has no words for


def test_admin_ops_need_the_admin_token_and_public_ones_nothing(doc: dict[str, Any]) -> None:
    assert doc["paths"]["/api/v1/things"]["post"]["security"] == [{"admin": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]
    assert "security" not in doc["paths"]["/metrics"]["get"]
    schemes = doc["components"]["securitySchemes"]
    assert schemes["admin"]["scheme"] == "bearer" and schemes["apiKey"]["scheme"] == "bearer"


def test_an_answer_that_is_not_json_is_a_string_of_its_media(doc: dict[str, Any]) -> None:
    ok = doc["paths"]["/metrics"]["get"]["responses"]["200"]
    assert ok["content"] == {"text/plain": {"schema": {"type": "string"}}}
    default = doc["paths"]["/api/v1/things"]["get"]["responses"]["200"]
    assert default["content"] == {"application/json": {"schema": {"type": "object"}}}


# --- /v1 -----------------------------------------------------------------------------


def _chat_body(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    post = doc["paths"]["/v1/chat/completions"]["post"]
    return jsonschema.Draft202012Validator(
        post["requestBody"]["content"]["application/json"]["schema"]
    )


def test_the_gateways_routes_need_a_key_and_answer_openais_errors(doc: dict[str, Any]) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        post = doc["paths"][path]["post"]
        assert post["security"] == [{"apiKey": []}]
        assert post["requestBody"]["required"] is True
        for code, answer in post["responses"].items():
            if code != "200":
                assert answer["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/OpenAIError"
                }
    assert doc["paths"]["/v1/models"]["get"]["operationId"] == "v1_models"


def test_the_chat_schema_takes_a_request_the_gateway_takes(doc: dict[str, Any]) -> None:
    chat = _chat_body(doc)
    good = {
        "model": "m1",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "temperature": 0.2,
        "stream": True,
        "frobnicate": 1,  # the engine's to judge: passed through, so not refused here
    }
    assert chat.is_valid(good)
    assert chat.is_valid({**good, "messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert (
        set(chat.schema["properties"]["messages"]["items"]["properties"]["role"]["enum"]) == ROLES
    )


@pytest.mark.parametrize(
    "change",
    [
        {"model": "m3"},  # not in the catalog
        {"messages": []},
        {"messages": [{"role": "user", "content": "x"}] * 51},  # over max_messages
        {"messages": [{"role": "robot", "content": "x"}]},
        {"n": MAX_N + 1},
        {"temperature": 2.5},
        {"max_tokens": -1},
        {"stop": ["s"] * 17},
    ],
)
def test_the_chat_schema_refuses_what_the_gateway_refuses(
    change: dict[str, Any], doc: dict[str, Any]
) -> None:
    good = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    assert not _chat_body(doc).is_valid({**good, **change})


def test_without_a_catalog_the_model_is_any_short_name() -> None:
    bare = document([], Bounds())
    jsonschema.Draft202012Validator(OPENAPI_31).validate(bare)
    chat = _chat_body(bare)
    assert chat.is_valid({"model": "anything", "messages": [{"role": "user", "content": ""}]})
    assert not chat.is_valid({"model": "", "messages": [{"role": "user", "content": ""}]})
    # The admin part is what the Ops declare: none here.
    assert sorted(bare["paths"]) == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
    ]
