"""``llmgw login``'s device flow and the audit log, as admin API routes over
``DeviceLogins`` and ``AuditLog`` (``server/people/``), which check every right.

The device routes are public: ctl has no token yet. What they give away is nothing
until a signed-in person approves the code on the pages (``pages/devicepages.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.server.access import Access
from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.people.auditlog import AuditLog, entry_json
from llmgw.server.people.devicelogin import INTERVAL, TTL, DeviceAsk, DeviceLogins, DevicePoll
from llmgw.server.people.orgs import OrgService
from llmgw.server.people.views import token_json
from llmgw.server.schema import spec
from llmgw.wire.admin import AuditEntryJson, DeviceCodeJson, DeviceTokenJson


@dataclass(frozen=True)
class AuditQuery:
    org: str | None = spec(
        None,
        doc="only this organisation's (id or name); needed but for the cluster's staff",
        max_length=128,
    )
    person: str | None = spec(
        None, doc="only what this person (id or login) or admin@HOST did", max_length=128
    )
    since: float | None = spec(None, doc="only from this time on (Unix seconds)", minimum=0)
    limit: int = spec(100, doc="the newest this many", minimum=1, maximum=5000)


def routes(logins: DeviceLogins, orgs: OrgService) -> Ops:
    audit = AuditLog(orgs.store, orgs.directory, orgs)

    async def start(call: Call[DeviceAsk, None]) -> DeviceCodeJson:
        address = call.request.client.host if call.request.client else "?"
        code = logins.start(call.body.client, address)
        base = str(call.request.base_url).rstrip("/")
        return {
            "device_code": code.device_code,
            "user_code": code.user_code,
            "verify_url": f"{base}/admin/device?code={code.user_code}",
            "interval": INTERVAL,
            "expires_in": int(TTL),
        }

    async def token(call: Call[DevicePoll, None]) -> DeviceTokenJson:
        record, made, login = await logins.token(call.body.device_code)
        return {**token_json(record), "token": made, "login": login}

    async def entries(call: Call[None, AuditQuery]) -> list[AuditEntryJson]:
        q = call.query
        found = await audit.entries(call.principal, q.org, q.person, q.since, q.limit)
        return [entry_json(e) for e in found]

    public: Access = "public"
    return [
        Op(
            "POST",
            "/api/v1/login/device",
            start,
            "Start `llmgw login`: a code for its person to approve on the pages",
            body=DeviceAsk,
            body_optional=True,
            errors=(429,),
            access=public,
        ),
        Op(
            "POST",
            "/api/v1/login/device/token",
            token,
            "Poll `llmgw login`: its personal token once approved (once)",
            body=DevicePoll,
            errors=(400, 403),
            access=public,
        ),
        Op(
            "GET",
            "/api/v1/audit",
            entries,
            "The audit log, newest first (an organisation's for its managers)",
            query=AuditQuery,
            answer={"type": "array", "items": {"type": "object"}},
            errors=(403, 404),
            access="member",
        ),
    ]
