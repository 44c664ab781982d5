"""The ``llmgw`` command line: one program, every role, imported lazily per command.

Each command imports only what it needs, so ``llmgw agent run`` never loads the
control plane's web stack or the console's UI toolkit. Here are the roles' own commands
(server, agent, node, console, doctor), the parser and ``main``; the ``ctl`` commands and
their parsers are in ``llmgw.client.ctl_*``, one module to each part of the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from llmgw import __version__
from llmgw.cliargs import UsageError, parse_duration

if TYPE_CHECKING:  # imported lazily where used: each command loads only its role
    from llmgw.client.admin import AdminClient
    from llmgw.tui.setup import InitHooks

Handler = Callable[[argparse.Namespace], int]


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _data_dir(args: argparse.Namespace) -> Path:
    from llmgw.config import default_data_dir

    return Path(args.data_dir) if args.data_dir else default_data_dir()


def _client(args: argparse.Namespace) -> AdminClient:
    from llmgw.client.admin import resolve

    data_dir = Path(args.data_dir) if args.data_dir else None
    return resolve(args.server, args.token, data_dir)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


# --- server ---------------------------------------------------------------------------


def init_hooks() -> InitHooks:
    """The data dir code the setup form runs: handed in, as the console never imports
    the control plane."""
    from llmgw.server.datadir import DataDir, InitError, default_advertise, init
    from llmgw.tui.setup import InitHooks

    return InitHooks(
        init=init,
        existing=lambda root: DataDir(root).existing(),
        default_advertise=default_advertise,
        token_path=lambda root: DataDir(root).admin_token,
        errors=(InitError,),
    )


class _InitOptions(TypedDict, total=False):
    """The flags ``server init`` was given, as ``datadir.init`` takes them."""

    listen: str
    agent_port: int
    advertise: list[str] | None
    name: str
    peer_port: int
    store: str
    dsn: str


def cmd_server_init(args: argparse.Namespace) -> int:
    from llmgw.server.datadir import DataDir, InitError, init

    root = _data_dir(args)
    flags = (args.listen, args.agent_port, args.advertise, args.store, args.dsn)
    if args.config is not None or args.keys is not None:
        if args.bundle:
            raise UsageError("--bundle goes without --config: import it with `llmgw bundle import`")
        return _server_init_from(root, args, flags)
    # --bundle is a flag given too: no full-screen form.
    if all(f is None for f in (*flags, args.bundle)) and not args.yes and _terminal():
        from llmgw.tui.setup import SetupApp

        result = SetupApp(root, init_hooks()).run()
        if result is None:
            print("Nothing was changed.")
            return 1
        print(f"Initialised the control plane in {result.root}")
        print(f"Admin token kept, readable by you alone, in {result.root / 'admin.token'}")
        print(f"Next: llmgw server run --data-dir {result.root}")
        return 0
    if not args.yes and sys.stdin.isatty():
        present = DataDir(root).existing()
        if not present:
            answer = input(f"Create a new llmgw control plane in {root}? [Y/n] ").strip()
            if answer.lower() not in ("", "y", "yes"):
                print("Nothing was changed.")
                return 1
    # Only the flags given: init's own defaults are the flag form's.
    given: _InitOptions = {"advertise": args.advertise or None}
    if args.listen is not None:
        given["listen"] = args.listen
    if args.agent_port is not None:
        given["agent_port"] = args.agent_port
    if args.name is not None:
        given["name"] = args.name
    if args.peer_port is not None:
        given["peer_port"] = args.peer_port
    if args.store is not None:
        given["store"] = args.store
    if args.dsn is not None:
        if args.store != "postgres":
            raise UsageError("--dsn goes with --store postgres")
        given["dsn"] = args.dsn
    elif args.store == "postgres":
        raise UsageError(
            "--store postgres needs --dsn (e.g. 'host=db1,db2 dbname=llmgw "
            "user=llmgw target_session_attrs=read-write')"
        )
    try:
        config, token = init(root, **given)
    except InitError as exc:
        raise UsageError(str(exc)) from exc
    from llmgw.client.admin import local_url

    print(f"Initialised the control plane in {root}")
    print(f"  HTTP (/v1, /api/v1, /admin): {config.listen}  ->  {local_url(config.listen)}")
    print(f"  agents' port (mutual TLS, HTTP/2): {config.agent_port}")
    print(f"  advertised as: {', '.join(config.advertise)}")
    print()
    print(f"Admin token (shown once; also kept, readable by you alone, in {root / 'admin.token'}):")
    print(f"  {token}")
    print()
    if args.bundle:
        return _init_bundle(root, Path(args.bundle))
    print(f"Next: llmgw server run --data-dir {root}")
    return 0


def _init_bundle(root: Path, bundle: Path) -> int:
    """``server init --bundle``: the new data dir's mirror filled, and served."""
    import dataclasses

    from llmgw.client.bundlecmd import import_into
    from llmgw.config import OfflineConfig, ServerConfig, dump, load

    if import_into(bundle, root) != 0:
        print(f"The data dir {root} was made; import a good bundle with `llmgw bundle import`.")
        return 1
    path = root / "server.yaml"
    config = load(ServerConfig, path)
    path.write_text(dump(dataclasses.replace(config, offline=OfflineConfig(mirror=True))))
    print("offline.mirror is set: the nodes install from this control plane's mirror.")
    print(f"Next: llmgw server run --data-dir {root}")
    return 0


def _server_init_from(root: Path, args: argparse.Namespace, flags: tuple[object, ...]) -> int:
    """``server init --config FILE [--keys DIR]``: the data dir made or brought up to
    date from a settings file, on every start (Kubernetes' init step)."""
    from llmgw.config import ConfigError
    from llmgw.server.datadir import InitError, ensure

    if args.config is None:
        raise UsageError("--keys goes with --config FILE (the settings to start from)")
    if any(f is not None for f in flags) or args.name is not None or args.peer_port is not None:
        raise UsageError(
            "--config takes every setting from its file: leave out --listen, --agent-port, "
            "--advertise, --name, --peer-port, --store and --dsn"
        )
    try:
        config = ensure(root, Path(args.config), Path(args.keys) if args.keys else None)
    except (InitError, ConfigError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"The control plane's data dir {root} is ready (settings from {args.config})")
    print(f"  advertised as: {', '.join(config.advertise) or '(this host)'}")
    print(f"  admin token kept, readable by its owner alone, in {root / 'admin.token'}")
    return 0


def _terminal() -> bool:
    """Both ends are a terminal: a full-screen form can be shown and answered."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def cmd_server_run(args: argparse.Namespace) -> int:
    from llmgw.server.front import event_loop_factory
    from llmgw.server.process import run_server

    _setup_logging(args.log_level)
    from llmgw.server.store import StoreError

    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            again = runner.run(run_server(_data_dir(args)))
    except StoreError as exc:  # a store that cannot be opened: said, not a traceback
        raise UsageError(str(exc)) from None
    if again is not None:
        from llmgw.reexec import exec_again

        exec_again(again.keep_fds, again.env())
    return 0


def cmd_server_local(args: argparse.Namespace) -> int:
    """``server join`` and ``server promote``: on this machine's data dir."""
    from llmgw.server.ha import commands

    run = commands.cmd_join if args.local == "join" else commands.cmd_promote
    return run(args, _data_dir(args))


# --- agent ----------------------------------------------------------------------------


def cmd_agent_run(args: argparse.Namespace) -> int:
    from llmgw.agent.service import AgentOptions, run_agent
    from llmgw.config import (
        AgentConfig,
        ConfigError,
        default_state_dir,
        default_weights_dir,
        load,
    )

    _setup_logging(args.log_level)
    state_dir = Path(args.state_dir) if args.state_dir else None
    config_path = Path(args.config) if args.config else None
    if config_path is None:
        candidate = (state_dir or default_state_dir()) / "agent.yaml"
        config_path = candidate if candidate.exists() else None
    config = load(AgentConfig, config_path) if config_path else AgentConfig()
    if state_dir is None:
        state_dir = Path(config.state_dir) if config.state_dir else default_state_dir()
    from llmgw.agent.clustersettings import ClusterSettings
    from llmgw.agent.engines.provision import parse_engine_option
    from llmgw.agent.runtime import RuntimeOptions

    # What the cluster said last (ctl config), under what agent.yaml says.
    state_dir.mkdir(parents=True, exist_ok=True)
    settings = ClusterSettings(state_dir, ClusterSettings.read_file(config_path))
    try:
        config = settings.config(config)
    except ConfigError as exc:
        logging.getLogger("llmgw.agent").warning(
            "the cluster's settings do not build here (%s); agent.yaml alone", exc
        )

    engines = dict(config.engines)
    for option in args.engine or []:
        name, path = parse_engine_option(option)
        engines[name] = path
    runtime = RuntimeOptions(
        state_dir=state_dir,
        weights_dir=Path(args.weights_dir or config.weights_dir or default_weights_dir()),
        release_source=args.release_source or config.release_source,
        llamacpp_version=config.llamacpp_version,
        converter_source=config.converter_source,
        engines=engines,
        hf_endpoint=config.hf_endpoint,
        engine_user=config.engine_user,
        settings=settings,
        running=config,
    )
    opts = AgentOptions(
        runtime=runtime,
        state_dir=state_dir,
        node_id=args.node_id or config.node_id,
        server=args.server or config.server,
        token=args.join_token or os.environ.get("LLMGW_JOIN_TOKEN") or config.token,
        data_dirs=tuple(Path(d) for d in config.data_dirs),
        heartbeat_interval=config.heartbeat_interval,
        discovery=config.discovery,
        metrics_listen=config.metrics_listen,
        metrics_scrapers=tuple(config.metrics_scrapers),
        tracing=config.tracing,
    )
    asyncio.run(run_agent(opts))
    return 0


# --- node -----------------------------------------------------------------------------


def cmd_node_token(args: argparse.Namespace) -> int:
    answer = _client(args).node_token(args.ttl)
    if args.json:
        _print_json(answer)
    else:
        print(answer["token"])
    return 0


def cmd_node_add(args: argparse.Namespace) -> int:
    from llmgw.client.nodeadd import add_node

    if args.host is None:
        if not _terminal():
            args.usage_error("the following arguments are required: host")
        from llmgw.tui.nodeadd import NodeAddApp

        code = NodeAddApp(_client(args), args).run()
        return 1 if code is None else code
    return add_node(args, _client(args))


# --- console --------------------------------------------------------------------------


def cmd_console(args: argparse.Namespace) -> int:
    from llmgw.tui.api import ConsoleApi
    from llmgw.tui.app import ConsoleApp

    ConsoleApp(ConsoleApi(_client(args))).run()
    return 0


# --- doctor ---------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from llmgw.agent.checkup import run_doctor

    return run_doctor(args)


# --- parser ---------------------------------------------------------------------------


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", help="control plane HTTP address, HOST:PORT (or LLMGW_SERVER)")
    p.add_argument(
        "--token", help="a personal token or the admin token (or LLMGW_TOKEN; else `llmgw login`'s)"
    )
    p.add_argument("--data-dir", help="control plane data dir to find both in (or LLMGW_DATA_DIR)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw", description="A private LLM cloud on your own machines."
    )
    parser.add_argument("--version", action="version", version=f"llmgw {__version__}")
    roles = parser.add_subparsers(dest="command", metavar="COMMAND")

    server = roles.add_parser("server", help="the control plane")
    server_cmds = server.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = server_cmds.add_parser("init", help="create a control plane's data dir, CA and token")
    p.add_argument("--data-dir", help="where to keep state (or LLMGW_DATA_DIR)")
    p.add_argument(
        "--listen",
        help="HTTP listener of /v1, /api/v1 and /admin (default 0.0.0.0:8080)",
    )
    p.add_argument(
        "--agent-port",
        type=int,
        help="port of the agents' mutual-TLS HTTP/2 stream (default 8443)",
    )
    p.add_argument(
        "--advertise",
        action="append",
        metavar="ADDRESS",
        help="an address agents reach this machine at (repeat; default: found)",
    )
    p.add_argument("--name", help="this control plane's name (default: the hostname)")
    p.add_argument("--peer-port", type=int, help="the control planes' link (default 8444)")
    p.add_argument(
        "--store",
        choices=("sqlite", "postgres"),
        help="where the cluster's state is kept (default sqlite, in the data dir)",
    )
    p.add_argument("--dsn", help="with --store postgres: a libpq DSN or postgresql:// URI")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="take server.yaml from FILE and make the data dir, or bring it up to date "
        "(certificates issued again, the store seeded once): for Kubernetes' init step, "
        "run on every start",
    )
    p.add_argument(
        "--keys",
        metavar="DIR",
        help="with --config: ca.crt, ca.key, cluster.key and admin.token from DIR "
        "(a mounted Secret) instead of made here",
    )
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.add_argument(
        "--bundle", metavar="PATH", help="import an offline bundle and serve it (offline.mirror)"
    )
    p.set_defaults(handler=cmd_server_init)
    p = server_cmds.add_parser("run", help="run the control plane in the foreground")
    p.add_argument("--data-dir", help="state dir made by `server init` (or LLMGW_DATA_DIR)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(handler=cmd_server_run)
    from llmgw.client.ctl_servers import add_parsers as add_server_parsers

    agent = roles.add_parser("agent", help="the node agent")
    agent_cmds = agent.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = agent_cmds.add_parser("run", help="join (once) and serve this node")
    p.add_argument("--server", help="control plane HTTP address to enroll with, HOST:PORT")
    p.add_argument(
        "--token",
        dest="join_token",
        help="join token from `llmgw node token` (or LLMGW_JOIN_TOKEN)",
    )
    p.add_argument("--state-dir", help="where the node keeps its key and certificate")
    p.add_argument("--node-id", help="this node's id (default: its hostname)")
    p.add_argument("--config", help="agent.yaml (default: STATE_DIR/agent.yaml if present)")
    p.add_argument(
        "--engine",
        action="append",
        metavar="NAME=PATH",
        help="an engine to use as it is, e.g. llama.cpp=/opt/llama/llama-server (repeat)",
    )
    p.add_argument(
        "--weights-dir", help="where fetched weights are kept (default /var/lib/llmgw-weights)"
    )
    p.add_argument(
        "--release-source", help="where llama.cpp releases come from (GitHub's release layout)"
    )
    p.add_argument("--log-level", default="info")
    p.set_defaults(handler=cmd_agent_run)

    node = roles.add_parser("node", help="add nodes to the cluster")
    node_cmds = node.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = node_cmds.add_parser("token", help="print a join token for a new node")
    p.add_argument(
        "--ttl",
        type=parse_duration,
        default=3600,
        help="how long it is good for (default 1h; 30m, 2d, ...)",
    )
    p.add_argument("--json", action="store_true")
    _client_options(p)
    p.set_defaults(handler=cmd_node_token)
    from llmgw.client.zipappsource import release_options

    p = node_cmds.add_parser("add", help="install and start an agent on HOST over ssh")
    p.add_argument("host", nargs="?", help="the node (left out, in a terminal: a form)")
    p.add_argument("--user", help="ssh user (default: yours)")
    p.add_argument("--ssh-port", type=int, default=22)
    p.add_argument("--ssh-key", help="ssh identity file")
    p.add_argument(
        "--ssh-option", action="append", metavar="OPTION", help="extra ssh -o OPTION (repeat)"
    )
    p.add_argument("--node-id", help="the node's id (default: its hostname)")
    p.add_argument(
        "--prefix", default="/opt/llmgw", help="where to install on the node (default /opt/llmgw)"
    )
    release_options(p)
    p.add_argument("--control-plane", help="HOST:PORT the node reaches the control plane at")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for Ready")
    _client_options(p)
    p.set_defaults(handler=cmd_node_add, usage_error=p.error)

    ctl = roles.add_parser("ctl", help="look at and steer the cluster")
    ctl_cmds = ctl.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    from llmgw.client.ctl_nodes import add_parsers as add_node_parsers

    add_node_parsers(ctl_cmds, _client, _client_options)

    from llmgw.client.ctl_models import add_parsers as add_catalog_parsers

    add_catalog_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_jobs import add_parsers as add_job_parsers

    add_job_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_keys import add_parsers as add_key_parsers

    add_key_parsers(roles, ctl_cmds, _client, _client_options)
    add_server_parsers(server_cmds, ctl_cmds, _client, _client_options, cmd_server_local)
    from llmgw.client.ctl_config import add_parsers as add_config_parsers

    add_config_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_engines import add_parsers as add_engine_parsers

    add_engine_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_firewall import add_parsers as add_firewall_ctl_parsers

    add_firewall_ctl_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_guard import add_parsers as add_guard_parsers

    add_guard_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_slurm import add_parsers as add_slurm_parsers

    add_slurm_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_mcp import add_parsers as add_mcp_parsers

    add_mcp_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_finetune import add_parsers as add_finetune_parsers

    add_finetune_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_upgrade import add_parsers as add_upgrade_parsers

    add_upgrade_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_fabrics import add_parsers as add_fabric_parsers

    add_fabric_parsers(ctl_cmds, _client, _client_options)
    from llmgw.client.ctl_auth import add_parsers as add_auth_parsers
    from llmgw.client.ctl_ldap import add_parsers as add_ldap_parsers
    from llmgw.client.ctl_scim import add_parsers as add_scim_parsers

    auth_cmds = add_auth_parsers(ctl_cmds, _client, _client_options)
    add_ldap_parsers(auth_cmds, _client, _client_options)
    add_scim_parsers(auth_cmds, _client, _client_options)

    from llmgw.client import ctl_login, ctl_orgs, ctl_people

    ctl_people.add_parsers(ctl_cmds, _client, _client_options)
    ctl_orgs.add_parsers(ctl_cmds, _client, _client_options)
    ctl_login.add_parsers(roles)

    from llmgw.client import restart, service

    restart.add_parsers(roles, _client, _client_options)
    service.add_parsers(roles)

    from llmgw.client import ctl_version

    ctl_version.add_parsers(roles, _client, _client_options)
    from llmgw.sim.command import add_parsers as add_sim_parsers

    add_sim_parsers(roles)

    p = roles.add_parser("console", help="the full-screen console of the cluster")
    _client_options(p)
    p.set_defaults(handler=cmd_console)

    p = roles.add_parser("doctor", help="check this machine (and its link to the cluster)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--state-dir", help="agent state dir (default: the usual one, if present)")
    p.set_defaults(handler=cmd_doctor)
    from llmgw.agent.firewallcmd import add_parsers as add_firewall_parsers

    add_firewall_parsers(roles)
    from llmgw.wipe.command import add_parsers as add_wipe_parsers

    add_wipe_parsers(roles)
    from llmgw.client.bundlecmd import add_parsers as add_bundle_parsers

    add_bundle_parsers(roles)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from llmgw.wipe.command import confirm_spelling

    parser = build_parser()
    args = parser.parse_args(confirm_spelling(sys.argv[1:] if argv is None else argv))
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        # A role without its subcommand: show that role's help.
        target = args.command
        if target:
            parser.parse_args([target, "--help"])
        parser.print_help()
        return 2
    from llmgw.client.adminbase import AdminError
    from llmgw.config import ConfigError

    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except (UsageError, AdminError, ConfigError) as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from llmgw.agent.engines import EngineError
        from llmgw.agent.identity import EnrollError
        from llmgw.jointoken import TokenError

        if isinstance(exc, EnrollError | TokenError | EngineError):
            print(f"llmgw: {exc}", file=sys.stderr)
            return 1
        raise


def entry() -> None:
    sys.exit(main())
