"""SCIM's discovery documents (RFC 7644 4, RFC 7643 5-7): what llmgw's SCIM service
does (``ServiceProviderConfig``), the resource types it serves, and the schemas of
exactly the attributes it keeps (``documents.py``), so a provider or a tester learns
from them what it may send and what comes back as it was sent."""

from __future__ import annotations

from typing import Any

from llmgw.server.scim.paths import GROUP, USER

SPC = "urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig"
RESOURCE_TYPE = "urn:ietf:params:scim:schemas:core:2.0:ResourceType"
SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Schema"
LIST = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
# The most resources one page of a list answers.
MAX_RESULTS = 1000

Doc = dict[str, Any]


def attribute(
    name: str,
    kind: str = "string",
    *,
    description: str,
    required: bool = False,
    multi: bool = False,
    mutability: str = "readWrite",
    returned: str = "default",
    uniqueness: str = "none",
    case_exact: bool = False,
    sub: list[Doc] | None = None,
    references: list[str] | None = None,
) -> Doc:
    doc: Doc = {
        "name": name,
        "type": kind,
        "multiValued": multi,
        "description": description,
        "required": required,
        "caseExact": case_exact,
        "mutability": mutability,
        "returned": returned,
        "uniqueness": uniqueness,
    }
    if sub is not None:
        doc["subAttributes"] = sub
    if references is not None:
        doc["referenceTypes"] = references
    return doc


USER_ATTRIBUTES = [
    attribute(
        "userName",
        description="The login the person signs in as (lower-cased).",
        required=True,
        uniqueness="server",
    ),
    attribute("displayName", description="The person's full name."),
    attribute(
        "emails",
        "complex",
        description="The person's e-mail address: llmgw keeps one (the primary).",
        multi=True,
        sub=[attribute("value", description="The address.")],
    ),
    attribute("active", "boolean", description="False: deactivated; their sessions end."),
    attribute(
        "groups",
        "complex",
        description="The groups the person is a member of (changed through /Groups).",
        multi=True,
        mutability="readOnly",
        sub=[
            attribute("value", description="The group's id.", mutability="readOnly"),
            attribute(
                "$ref",
                "reference",
                description="The group's URI.",
                mutability="readOnly",
                references=["Group"],
            ),
            attribute("display", description="The group's name.", mutability="readOnly"),
        ],
    ),
]

GROUP_ATTRIBUTES = [
    attribute(
        "displayName",
        description="The group's name, as `ctl auth scim map` maps it.",
        required=True,
    ),
    attribute(
        "members",
        "complex",
        description="The people in the group.",
        multi=True,
        sub=[
            attribute("value", description="The person's id.", mutability="immutable"),
            attribute(
                "$ref",
                "reference",
                description="The person's URI.",
                mutability="immutable",
                references=["User"],
            ),
        ],
    ),
]


def _schema(urn: str, name: str, description: str, attributes: list[Doc], base: str) -> Doc:
    return {
        "schemas": [SCHEMA],
        "id": urn,
        "name": name,
        "description": description,
        "attributes": attributes,
        "meta": {"resourceType": "Schema", "location": f"{base}/Schemas/{urn}"},
    }


def schemas(base: str) -> list[Doc]:
    """Every schema, users' and groups' first; then the three of discovery itself."""
    text = "string"
    return [
        _schema(USER, "User", "A person of the cluster", USER_ATTRIBUTES, base),
        _schema(GROUP, "Group", "A group of the identity provider", GROUP_ATTRIBUTES, base),
        _schema(
            RESOURCE_TYPE,
            "ResourceType",
            "A type of resource this service serves",
            [
                attribute("id", text, description="Its id.", mutability="readOnly"),
                attribute(
                    "name", text, description="Its name.", required=True, mutability="readOnly"
                ),
                attribute(
                    "endpoint",
                    "reference",
                    description="Its endpoint.",
                    required=True,
                    mutability="readOnly",
                    references=["uri"],
                ),
                attribute(
                    "schema",
                    "reference",
                    description="Its schema.",
                    required=True,
                    mutability="readOnly",
                    references=["uri"],
                    case_exact=True,
                ),
            ],
            base,
        ),
        _schema(
            SPC,
            "ServiceProviderConfig",
            "What this service does",
            [
                attribute(
                    "patch",
                    "complex",
                    description="PATCH.",
                    required=True,
                    mutability="readOnly",
                    sub=[
                        attribute(
                            "supported",
                            "boolean",
                            description="Whether.",
                            required=True,
                            mutability="readOnly",
                        )
                    ],
                ),
            ],
            base,
        ),
        _schema(
            SCHEMA,
            "Schema",
            "A schema's attributes",
            [
                attribute("id", text, description="Its URN.", mutability="readOnly"),
                attribute("name", text, description="Its name.", mutability="readOnly"),
            ],
            base,
        ),
    ]


def resource_types(base: str) -> list[Doc]:
    return [
        {
            "schemas": [RESOURCE_TYPE],
            "id": name,
            "name": name,
            "endpoint": f"/{name}s",
            "description": description,
            "schema": urn,
            "meta": {"resourceType": "ResourceType", "location": f"{base}/ResourceTypes/{name}"},
        }
        for name, urn, description in (
            ("User", USER, "A person of the cluster"),
            ("Group", GROUP, "A group, mapped to memberships by `ctl auth scim map`"),
        )
    ]


def service_provider_config(base: str) -> Doc:
    no = {"supported": False}
    return {
        "schemas": [SPC],
        "patch": {"supported": True},
        "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
        "filter": {"supported": True, "maxResults": MAX_RESULTS},
        "changePassword": no,
        "sort": no,
        "etag": no,
        "authenticationSchemes": [
            {
                "type": "oauthbearertoken",
                "name": "SCIM token",
                "description": "The token `llmgw ctl auth scim token` made, as a bearer token",
                "primary": True,
            }
        ],
        "meta": {
            "resourceType": "ServiceProviderConfig",
            "location": f"{base}/ServiceProviderConfig",
        },
    }


def list_response(resources: list[Doc], total: int, start: int) -> Doc:
    return {
        "schemas": [LIST],
        "totalResults": total,
        "startIndex": start,
        "itemsPerPage": len(resources),
        "Resources": resources,
    }


def error(status: int, detail: str, scim_type: str | None = None) -> Doc:
    doc: Doc = {"schemas": [ERROR], "status": str(status), "detail": detail}
    if scim_type:
        doc["scimType"] = scim_type
    return doc
