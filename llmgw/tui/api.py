"""The console's view of the admin API: the synchronous client run off the UI's loop,
and one snapshot of everything the screens show, fetched together.

Each call names its ``Route`` (``llmgw.client.routes``): the path, and the shape its
answer is read as (``llmgw.wire.admin``). Every call goes through ``get``, ``post`` or
``delete``, which hand the path to the client in a thread: the one seam a test's fake
answers at."""

from __future__ import annotations

import asyncio
import time
import urllib.error
from dataclasses import dataclass, field
from typing import TypeVar

from llmgw.client import routes
from llmgw.client.admin import AdminClient
from llmgw.client.adminbase import AdminError
from llmgw.client.ctl_auth import OIDC, OIDC_OFF
from llmgw.client.ctl_ldap import LDAP, LDAP_OFF
from llmgw.client.ctl_scim import SCIM, SCIM_OFF
from llmgw.client.routes import Body, Query, Route
from llmgw.wire.admin import (
    EnginesJson,
    FabricMapJson,
    FabricsJson,
    HistoryJson,
    KeyJson,
    MembershipJson,
    ModelJson,
    ModelRemovedJson,
    NewKeyJson,
    NodeJson,
    NvlinkJson,
    OidcJson,
    OrgJson,
    PersonJson,
    PlanJson,
    ProjectJson,
    ReplicaJson,
    SlurmJson,
    StatusJson,
    TeamJson,
)
from llmgw.wire.admin.ldap import LdapSettingsJson
from llmgw.wire.admin.scim import ScimJson

T = TypeVar("T")


def refused(exc: AdminError) -> bool:
    """Whether the control plane answered 403: the caller's role falls short."""
    cause = exc.__cause__
    return isinstance(cause, urllib.error.HTTPError) and cause.code == 403


@dataclass
class Snapshot:
    """What the control plane said at ``at``; ``error`` when it could not be reached;
    ``status`` None before the first answer."""

    at: float = 0.0
    status: StatusJson | None = None
    nodes: list[NodeJson] = field(default_factory=list)
    models: list[ModelJson] = field(default_factory=list)
    replicas: list[ReplicaJson] = field(default_factory=list)
    keys: list[KeyJson] = field(default_factory=list)
    # Those the caller may see (``GET /api/v1/people``, ``/orgs``).
    people: list[PersonJson] = field(default_factory=list)
    orgs: list[OrgJson] = field(default_factory=list)
    error: str | None = None


class ConsoleApi:
    def __init__(self, client: AdminClient) -> None:
        self.client = client

    @property
    def base_url(self) -> str:
        return self.client.base_url

    async def get(self, path: str) -> object:
        return await asyncio.to_thread(self.client.get, path)

    async def post(self, path: str, body: Body | None = None) -> object:
        return await asyncio.to_thread(self.client.post, path, body or {})

    async def delete(self, path: str) -> object:
        return await asyncio.to_thread(self.client.request, "DELETE", path)

    async def call(
        self,
        route: Route[T],
        *parts: str,
        body: Body | None = None,
        query: Query | None = None,
    ) -> T:
        """``route``'s answer, as its shape."""
        path = route.at(*parts, query=query)
        if route.method == "GET":
            answer = await self.get(path)
        elif route.method == "POST":
            answer = await self.post(path, body)
        else:
            answer = await self.delete(path)
        return route.read(answer)

    # --- what the screens read

    async def node(self, node_id: str) -> NodeJson:
        return await self.call(routes.NODE, node_id)

    async def replicas(self) -> list[ReplicaJson]:
        return await self.call(routes.REPLICAS)

    async def engines(self) -> EnginesJson:
        return await self.call(routes.ENGINES)

    async def plan(self, query: Query) -> PlanJson:
        return await self.call(routes.PLAN, query=query)

    async def fabrics(self) -> FabricsJson:
        return await self.call(routes.FABRICS)

    async def fabric_map(self, fabric_id: str) -> FabricMapJson:
        return await self.call(routes.FABRIC_MAP, fabric_id)

    async def nvlink(self) -> NvlinkJson:
        return await self.call(routes.NVLINK)

    async def history(self, node_id: str, minutes: float = 60) -> HistoryJson | None:
        """A node's last ``minutes`` of figures (``GET /api/v1/nodes/{id}/history``,
        columnar, ``null`` where not read); None when the control plane answers 404, as
        one older than the history does."""
        try:
            return await self.call(routes.HISTORY, node_id, query={"minutes": f"{minutes:g}"})
        except AdminError as exc:
            cause = exc.__cause__
            if isinstance(cause, urllib.error.HTTPError) and cause.code == 404:
                return None
            raise

    async def slurm(self) -> SlurmJson:
        return await self.call(routes.SLURM)

    # --- what the screens change

    async def slurm_lend(self, nodes: list[str]) -> SlurmJson:
        return await self.call(routes.SLURM_LEND, body={"nodes": nodes})

    async def slurm_reclaim(self, nodes: list[str]) -> SlurmJson:
        return await self.call(routes.SLURM_RECLAIM, body={"nodes": nodes})

    async def serve(self, body: Body) -> ModelJson:
        return await self.call(routes.SERVE, body=body)

    async def change_model(self, name: str, change: str, body: Body | None = None) -> ModelJson:
        """stop, start, restart, context, gpus or replicas: the model as it now is."""
        return await self.call(routes.CHANGE_MODEL, name, change, body=body)

    async def remove_model(self, name: str, with_files: bool = False) -> ModelRemovedJson:
        query = {"with_files": 1} if with_files else None
        return await self.call(routes.REMOVE_MODEL, name, query=query)

    async def create_key(self, body: Body) -> NewKeyJson:
        return await self.call(routes.CREATE_KEY, body=body)

    async def revoke_key(self, key_id: str) -> KeyJson:
        return await self.call(routes.REVOKE_KEY, key_id)

    async def org_detail(
        self, org_id: str
    ) -> tuple[list[TeamJson], list[ProjectJson], list[MembershipJson]]:
        """An organisation's teams, projects and the members the caller may see."""
        teams, projects, members = await asyncio.gather(
            self.call(routes.TEAMS, org_id),
            self.call(routes.PROJECTS, org_id),
            self.call(routes.MEMBERS, org_id),
        )
        return teams, projects, members

    async def create_person(self, body: Body) -> PersonJson:
        return await self.call(routes.CREATE_PERSON, body=body)

    async def change_person(self, person_id: str, body: Body) -> PersonJson:
        return await self.call(routes.CHANGE_PERSON, person_id, body=body)

    async def create_team(self, org_id: str, body: Body) -> TeamJson:
        return await self.call(routes.CREATE_TEAM, org_id, body=body)

    async def set_member(self, org_id: str, body: Body) -> MembershipJson:
        return await self.call(routes.SET_MEMBER, org_id, body=body)

    async def signins(self) -> tuple[OidcJson, LdapSettingsJson, ScimJson]:
        """OIDC, LDAP and SCIM sign-in as the admin API shows them (no secret)."""
        oidc, ldap, scim = await asyncio.gather(self.call(OIDC), self.call(LDAP), self.call(SCIM))
        return oidc, ldap, scim

    async def signin_off(self, way: str) -> None:
        """Turn one sign-in off: ``oidc``, ``ldap`` or ``scim``."""
        if way == "oidc":
            await self.call(OIDC_OFF)
        elif way == "ldap":
            await self.call(LDAP_OFF)
        elif way == "scim":
            await self.call(SCIM_OFF)
        else:
            raise ValueError(f"no sign-in {way!r}: oidc, ldap or scim")

    async def status(self) -> StatusJson | None:
        """The cluster's status; None for a caller whose role does not read it."""
        try:
            return await self.call(routes.STATUS)
        except AdminError as exc:
            if refused(exc):
                return None
            raise

    async def unless_refused(self, route: Route[list[T]]) -> list[T]:
        """``route``'s list, or none when the caller's role does not reach it (a 403: a
        person with memberships only reads no cluster route)."""
        try:
            return await self.call(route)
        except AdminError as exc:
            if refused(exc):
                return []
            raise

    async def snapshot(self) -> Snapshot:
        try:
            (status, nodes, models, replicas, keys), (people, orgs) = await asyncio.gather(
                asyncio.gather(
                    self.status(),
                    self.unless_refused(routes.NODES),
                    self.unless_refused(routes.MODELS),
                    self.unless_refused(routes.REPLICAS),
                    self.call(routes.KEYS),
                ),
                asyncio.gather(self.call(routes.PEOPLE), self.call(routes.ORGS)),
            )
        except AdminError as exc:
            return Snapshot(at=time.time(), error=str(exc))
        return Snapshot(time.time(), status, nodes, models, replicas, keys, people, orgs)
