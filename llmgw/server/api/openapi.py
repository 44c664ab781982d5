"""``GET /api/v1/openapi.json``: the admin API and ``/v1``, written from the routes'
own declarations and the typed requests their services take.

Nothing here is written by hand per route: a route's path, access, body, query and
answers come from its ``Op``, and each body's and query's fields from the dataclass
``schema.read`` reads it with, so the document and the checks cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from llmgw import __version__
from llmgw.server import schema
from llmgw.server.api.routing import Op, Ops
from llmgw.server.gateway.checks import LENGTH_FIELDS, MAX_N, MAX_STOP, MAX_TOOLS, ROLES, Bounds

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "message", "code", "param"],
            "properties": {
                "type": {"type": "string"},
                "message": {"type": "string"},
                "code": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "field": {"type": "string"},
            },
        }
    },
}
OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
WHY = {
    400: "The request is not as documented; the message names the field",
    401: "No token (a personal one or the admin token), or a wrong one",
    403: "The caller's role does not reach what this needs (or a join token forged, used "
    "or expired)",
    404: "No such thing",
    408: "The body did not arrive in time",
    409: "Not now: the message says what is in the way",
    413: "The body is too large for this route",
    503: "The store cannot be written now; the message says why and the fix",
    504: "The node did not answer in time",
}


def document(ops: Ops, bounds: Bounds, models: list[str] | None = None) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        if "{rest:path}" in op.path or op.path == "/admin":
            continue  # the pages' placeholder: not an API
        path = _PARAM.sub(r"{\1}", op.path)
        paths.setdefault(path, {})[op.method.lower()] = _operation(op, path)
    paths.update(_gateway(bounds, models or []))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llmgw",
            "version": __version__,
            "description": "The admin API of an llmgw control plane, and its "
            "OpenAI-compatible gateway (/v1). Errors of the admin API are "
            '{"error": {"type", "message"}}; of /v1, OpenAI\'s shape.',
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "admin": {"type": "http", "scheme": "bearer", "description": "admin.token"},
                "apiKey": {"type": "http", "scheme": "bearer", "description": "a gateway key"},
            },
            "schemas": {"Error": ERROR, "OpenAIError": OPENAI_ERROR},
        },
    }


def _operation(op: Op[Any, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op, path)}
    params = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string", "maxLength": 256}}
        for n in re.findall(r"\{(\w+)\}", path)
    ]
    if op.query is not None:
        params.extend(_query_params(op.query))
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {
            "required": not op.body_optional,
            "content": {"application/json": {"schema": schema.json_schema(op.body)}},
        }
    responses: dict[str, Any] = {str(op.status): _answer(op)}
    codes = set(op.errors)
    if op.body is not None or op.query is not None:
        codes.add(400)
    if op.body is not None:
        codes.update((408, 413))
    if op.needs != "public":
        codes.update((401, 403))
        out["security"] = [{"admin": []}]
        out["x-llmgw-access"] = op.needs
    if op.method in ("POST", "DELETE"):
        codes.add(503)
    for code in sorted(codes):
        responses[str(code)] = {
            "description": WHY.get(code, "Refused"),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    out["responses"] = responses
    return out


def _operation_id(op: Op[Any, Any], path: str) -> str:
    words = [w for w in re.split(r"[^A-Za-z0-9]+", path) if w and w not in ("api", "v1")]
    return "_".join([op.method.lower(), *words])


def _answer(op: Op[Any, Any]) -> dict[str, Any]:
    if op.media == "application/json":
        return {"description": "OK", "content": {op.media: {"schema": op.answer}}}
    return {"description": "OK", "content": {op.media: {"schema": {"type": "string"}}}}


def _query_params(cls: type) -> list[dict[str, Any]]:
    body = schema.json_schema(cls)
    required = set(body.get("required", []))
    out = []
    for f in dataclasses.fields(cls):
        prop = body["properties"][f.name]
        # A query value is never null: its absence says "none".
        if "anyOf" in prop:
            prop = next(p for p in prop["anyOf"] if p.get("type") != "null")
        out.append({"name": f.name, "in": "query", "required": f.name in required, "schema": prop})
    return out


# ------------------------------------------------------------------------- /v1


def _gateway(bounds: Bounds, models: list[str]) -> dict[str, Any]:
    """/v1 as the gateway checks it: the fields it reads or caps, typed; the rest are
    the engine's to judge and pass through. ``model`` names the catalog's models."""
    text = {"type": "string"}
    part = {"type": "object", "required": ["type"], "properties": {"type": text}}
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": sorted(ROLES)},
            "content": _or_null({"anyOf": [text, {"type": "array", "items": part}]}),
            "name": text,
            "tool_calls": {"type": "array", "items": {"type": "object"}},
        },
    }
    tokens = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}}
    prompt = {
        "anyOf": [
            text,
            {"type": "array", "items": text, "minItems": 1, "maxItems": bounds.max_messages},
            {**tokens, "minItems": 1, "maxItems": bounds.max_messages},
            {"type": "array", "items": {**tokens, "minItems": 1}, "minItems": 1},
        ]
    }
    common: dict[str, Any] = {
        "model": (
            {"type": "string", "enum": models}
            if models
            else {"type": "string", "minLength": 1, "maxLength": 256}
        ),
        "stream": {"type": ["boolean", "null"]},
        "stream_options": _or_null(
            {
                "type": "object",
                "properties": {"include_usage": {"type": ["boolean", "null"]}},
            }
        ),
        **{
            name: {"type": ["integer", "null"], "minimum": 0, "maximum": 2**31 - 1}
            for name in LENGTH_FIELDS
        },
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_N},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "stop": _or_null({"anyOf": [text, {"type": "array", "items": text, "maxItems": MAX_STOP}]}),
        "tools": {
            "type": "array",
            "maxItems": MAX_TOOLS,
            "items": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": text,
                    "function": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": text, "parameters": {"type": "object"}},
                    },
                },
            },
        },
    }
    chat = _body(
        {
            **common,
            "messages": {
                "type": "array",
                "items": message,
                "minItems": 1,
                "maxItems": bounds.max_messages,
            },
        },
        ["model", "messages"],
    )
    completion = _body({**common, "prompt": prompt}, ["model", "prompt"])
    embedding = _body(
        {"model": common["model"], "input": prompt, "encoding_format": text},
        ["model", "input"],
    )
    listing = {
        "get": {
            "summary": "The models this key may use",
            "operationId": "v1_models",
            "security": [{"apiKey": []}],
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {
                        "application/json": {
                            "schema": {"type": "object", "required": ["object", "data"]}
                        }
                    },
                },
                "401": _openai_error("No key, or an unknown, revoked or expired one"),
            },
        }
    }
    return {
        "/v1/chat/completions": _gateway_op("Chat", "v1_chat", chat),
        "/v1/completions": _gateway_op("Text completion", "v1_completions", completion),
        "/v1/embeddings": _gateway_op("Embeddings", "v1_embeddings", embedding),
        "/v1/models": listing,
    }


def _or_null(schema_: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema_, {"type": "null"}]}


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _openai_error(why: str) -> dict[str, Any]:
    return {
        "description": why,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}},
    }


def _gateway_op(summary: str, op_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "operationId": op_id,
            "security": [{"apiKey": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {
                    "description": "The answer; with stream, server-sent events",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        # Each event, as a client reads it: its data and type.
                        "text/event-stream": {"schema": {"type": "object"}},
                    },
                },
                "400": _openai_error("A field the gateway or the engine refused, named"),
                "401": _openai_error("No key, or an unknown, revoked or expired one"),
                "404": _openai_error("No such model, or one this key may not use"),
                "408": _openai_error("The body did not arrive in time"),
                "429": _openai_error("Over the key's limits; Retry-After says when"),
                "502": _openai_error("No replica could be reached"),
                "503": _openai_error("No Ready replica, the model stopped, or serving stopped"),
                "504": _openai_error("No whole answer within gateway.request_timeout"),
            },
        }
    }
