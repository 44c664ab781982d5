"""``llmgw ctl orgs|teams|projects|members|limits ...``: organisations, their teams and
projects, who belongs where, and the limits of each level, thin calls of the admin API
with ``--json``.

Organisations, teams and projects are named by id or by name (a project also as
``TEAM/PROJECT``); every id is checked by the control plane to belong to the
organisation named, and a refusal comes back in its words.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TypeVar

from llmgw.client import Client, Subcommands, UsageError
from llmgw.client.admin import AdminClient
from llmgw.client.limitsflags import add_limit_flags, limits_body, limits_text, set_text, tools_cell
from llmgw.client.tables import render
from llmgw.wire.admin import LimitsJson, MembershipJson, OrgJson, ProjectJson, TeamJson

Shown = TypeVar("Shown")
DASH = "-"
ORG_ROLES = ("member", "manager", "admin")


def _n(value: int | None) -> str:
    return DASH if value is None else str(value)


def _limit_cells(limits: LimitsJson) -> list[str]:
    models = ",".join(limits["models"]) or "all"
    cells = [_n(limits["rpm"]), _n(limits["tpm"]), _n(limits["budget"]), models]
    return [*cells, tools_cell(limits["tools"]), ",".join(limits["guard"]) or DASH]


LIMIT_HEADS = ["RPM", "TPM", "BUDGET", "MODELS", "TOOLS", "GUARD"]


def orgs_table(orgs: list[OrgJson]) -> str:
    if not orgs:
        return "No organisations you may see."
    rows = [[o["name"], o["id"], *_limit_cells(o["limits"])] for o in orgs]
    return render(["NAME", "ID", *LIMIT_HEADS], rows)


def teams_table(teams: list[TeamJson]) -> str:
    if not teams:
        return "No teams. Make one with `llmgw ctl teams create --org ORG NAME`."
    rows = [[t["name"], t["id"], *_limit_cells(t["limits"])] for t in teams]
    return render(["NAME", "ID", *LIMIT_HEADS], rows)


def projects_table(projects: list[ProjectJson]) -> str:
    if not projects:
        return "No projects. Make one with `llmgw ctl projects create --org ORG --team TEAM NAME`."
    rows = [
        [p["team"] or p["team_id"], p["name"], p["id"], *_limit_cells(p["limits"])]
        for p in projects
    ]
    return render(["TEAM", "NAME", "ID", *LIMIT_HEADS], rows)


def members_table(members: list[MembershipJson]) -> str:
    if not members:
        return "No members."
    rows = [
        [
            m["login"] or m["person_id"],
            m["kind"],
            m["scope_name"] or m["scope_id"],
            m["role"],
            "by hand" if m["by_hand"] else "by groups",
        ]
        for m in members
    ]
    return render(["PERSON", "OF", "NAME", "ROLE", "SET"], rows)


def _named(ref: str, id_: str, name: str | None) -> bool:
    return ref == id_ or (name is not None and ref.strip().casefold() == name.casefold())


def project_ref(api: AdminClient, org: str, project: str, team: str | None) -> str:
    """A project as a path names it: ``TEAM/NAME`` (or ``--team``) found by its id, since
    a path's ``/`` cannot stand inside one of its parts."""
    if team is None and "/" not in project:
        return project
    if team is None:
        team, _, project = project.partition("/")
    found = [
        p
        for p in api.org_projects(org)
        if _named(team, p["team_id"], p["team"]) and _named(project, p["id"], p["name"])
    ]
    if not found:
        raise UsageError(
            f"{org} has no project {project!r} in team {team!r}; see `llmgw ctl projects list "
            f"--org {org}`"
        )
    return found[0]["id"]


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show(args: argparse.Namespace, value: Shown, text: Callable[[Shown], str]) -> int:
        print(json.dumps(value, indent=2) if args.json else text(value))
        return 0

    def leaf(
        sub: Subcommands,
        name: str,
        run: Callable[[argparse.Namespace], int],
        text: str,
        org: bool = True,
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text)
        if org:
            p.add_argument("--org", required=True, help="the organisation (id or name)")
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)
        p.set_defaults(handler=run)
        return p

    def group(name: str, text: str) -> Subcommands:
        return ctl_cmds.add_parser(name, help=text).add_subparsers(
            dest=f"{name}_command", metavar="ACTION"
        )

    # --- organisations

    def org_text(o: OrgJson) -> str:
        return f"{o['name']} (id {o['id']})\nlimits: {limits_text(o['limits'])}"

    sub = group("orgs", "organisations: list, show, create, rename, remove")
    leaf(sub, "list", lambda a: show(a, client(a).orgs(), orgs_table), "those you may see", False)
    leaf(
        sub, "show", lambda a: show(a, client(a).org(a.ref), org_text), "one organisation", False
    ).add_argument("ref", metavar="ORG", help="id or name")
    leaf(
        sub,
        "create",
        lambda a: show(a, client(a).create_org(a.name), org_text),
        "make an organisation (the cluster's admins)",
        False,
    ).add_argument("name")
    p = leaf(
        sub,
        "rename",
        lambda a: show(a, client(a).rename_org(a.ref, a.name), org_text),
        "rename an organisation (the cluster's admins)",
        False,
    )
    p.add_argument("ref", metavar="ORG", help="id or name")
    p.add_argument("name", help="the new name")
    leaf(
        sub,
        "remove",
        lambda a: show(a, client(a).remove_org(a.ref), lambda o: f"{o['name']} is removed"),
        "remove an organisation without teams or keys",
        False,
    ).add_argument("ref", metavar="ORG", help="id or name")

    # --- teams

    sub = group("teams", "an organisation's teams: list, create, remove")
    leaf(sub, "list", lambda a: show(a, client(a).org_teams(a.org), teams_table), "its teams")
    leaf(
        sub,
        "create",
        lambda a: show(a, client(a).create_team(a.org, a.name), lambda t: teams_table([t])),
        "make a team",
    ).add_argument("name")
    leaf(
        sub,
        "remove",
        lambda a: show(
            a, client(a).remove_team(a.org, a.team), lambda t: f"team {t['name']} is removed"
        ),
        "remove a team without projects",
    ).add_argument("team", help="id or name")

    # --- projects

    def projects_list(args: argparse.Namespace) -> int:
        found = client(args).org_projects(args.org)
        if args.team:
            found = [p for p in found if _named(args.team, p["team_id"], p["team"])]
        return show(args, found, projects_table)

    def projects_create(args: argparse.Namespace) -> int:
        made = client(args).create_project(args.org, args.team, args.name)
        return show(args, made, lambda p: projects_table([p]))

    def projects_remove(args: argparse.Namespace) -> int:
        api = client(args)
        gone = api.remove_project(args.org, project_ref(api, args.org, args.project, args.team))
        return show(args, gone, lambda p: f"project {p['team']}/{p['name']} is removed")

    sub = group("projects", "an organisation's projects: list, create, remove")
    leaf(sub, "list", projects_list, "its projects").add_argument("--team", help="only this team's")
    p = leaf(sub, "create", projects_create, "make a project in a team")
    p.add_argument("--team", required=True, help="the team it belongs to (id or name)")
    p.add_argument("name")
    p = leaf(sub, "remove", projects_remove, "remove a project without active keys")
    p.add_argument("--team", help="its team (id or name), where the name alone is not enough")
    p.add_argument("project", help="id, name or TEAM/NAME")

    # --- members

    def members_list(args: argparse.Namespace) -> int:
        found = client(args).org_members(args.org)
        if args.team:
            found = [
                m
                for m in found
                if m["kind"] == "team" and _named(args.team, m["scope_id"], m["scope_name"])
            ]
        return show(args, found, members_table)

    def members_set(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"person": args.person, "role": args.role}
        if args.team:
            body["team"] = args.team
        return show(args, client(args).set_member(args.org, body), lambda m: members_table([m]))

    def members_remove(args: argparse.Namespace) -> int:
        gone = client(args).remove_member(args.org, args.person, args.team)
        where = gone["scope_name"] or gone["scope_id"]
        return show(args, gone, lambda m: f"{m['login']} is no longer in {m['kind']} {where}")

    sub = group("members", "who belongs to an organisation or its teams: list, set, remove")
    leaf(sub, "list", members_list, "its members and its teams'").add_argument(
        "--team", help="only this team's"
    )
    p = leaf(sub, "set", members_set, "make a person a member, manager or admin")
    p.add_argument("person", help="id or login")
    p.add_argument("--team", help="of this team (id or name), not the organisation")
    p.add_argument("--role", choices=ORG_ROLES, default="member", help="(default member)")
    p = leaf(sub, "remove", members_remove, "end a person's membership")
    p.add_argument("person", help="id or login")
    p.add_argument("--team", help="of this team (id or name), not the organisation")

    # --- limits

    def limits_set(args: argparse.Namespace) -> int:
        body = limits_body(args)
        api = client(args)
        project = None if args.project is None else project_ref(api, args.org, args.project, None)
        set_ = api.set_limits(body, args.org, args.team, project)
        level = (
            f"team {args.team}"
            if args.team
            else f"project {args.project}"
            if args.project
            else f"organisation {args.org}"
        )
        return show(args, set_, lambda lim: set_text(level, lim))

    sub = group("limits", "limits of an organisation, team or project: set")
    p = leaf(sub, "set", limits_set, "set limits (the tightest of every level wins)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--team", help="a team's (id or name), not the organisation's")
    which.add_argument("--project", help="a project's (id, name or TEAM/NAME)")
    add_limit_flags(p)
