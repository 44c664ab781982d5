"""``llmgw bundle create|import`` and ``llmgw mirror serve``: the command line of offline
bundles and mirrors (``llmgw/offline``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from llmgw import __version__
from llmgw.cliargs import UsageError
from llmgw.config import ServerConfig, default_data_dir, load
from llmgw.offline.manifest import BundleError

MIRROR = "mirror"


def _server_config(data_dir: Path) -> ServerConfig | None:
    path = data_dir / "server.yaml"
    return load(ServerConfig, path) if path.is_file() else None


def engine_pins(config: ServerConfig | None) -> dict[str, dict[str, object]]:
    """The engines this llmgw names, with the server's ``engines:`` over them."""
    from llmgw.enginepins import parse_wanted, pinned

    pins: dict[str, dict[str, object]] = dict(pinned())
    if config is not None and config.engines:
        pins.update(parse_wanted(config.engines))
    return pins


def _human(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def cmd_create(args: argparse.Namespace) -> int:
    from llmgw import release
    from llmgw.offline.bundle import ENGINE_SOURCE, BundlePlan, create

    data_dir = Path(args.data_dir) if args.data_dir else None
    config = _server_config(data_dir) if data_dir else None
    pins = engine_pins(config)
    unknown = [e for e in args.engines if e not in pins]
    if unknown:
        raise UsageError(
            f"--engines {unknown[0]}: no version of it is named (pin one with `engines:` in "
            "server.yaml, then give --data-dir)"
        )
    source = args.llmgw_source or (config.releases.source if config else release.DEFAULT_SOURCE)
    plan = BundlePlan(
        out=Path(args.output),
        llmgw_version=args.llmgw_version or __version__,
        llmgw_source=source,
        platforms=args.platform or [release.platform_tag()],
        engines={name: pins[name] for name in args.engines},
        engine_source=args.engine_source or ENGINE_SOURCE,
        engine_builds=args.engine_build or ["cpu"],
        models=args.models or [],
        hub_endpoint=args.hub,
    )
    try:
        made = asyncio.run(create(plan, say=lambda words: print(words, file=sys.stderr)))
    except BundleError as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return 1
    print(f"Bundle written to {made.path}: {made.files} files, {_human(made.size)}")
    print(f"manifest sha256: {made.manifest_sha256}")
    if made.path.suffix == ".tar":
        print("Carry this digest apart and give it to `llmgw bundle import --manifest-sha256`.")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    if not (data_dir / "server.yaml").is_file():
        raise UsageError(
            f"{data_dir} is not a control plane's data dir (no server.yaml): give "
            "--data-dir, or make one with `llmgw server init --bundle PATH`"
        )
    return import_into(Path(args.path), data_dir, args.manifest_sha256)


def import_into(bundle: Path, data_dir: Path, manifest_sha256: str | None = None) -> int:
    """Import ``bundle`` into ``data_dir``'s mirror, saying what happened."""
    from llmgw.offline.bundleimport import import_bundle

    try:
        done = import_bundle(
            bundle,
            data_dir / MIRROR,
            pins=engine_pins(_server_config(data_dir)),
            manifest_sha256=manifest_sha256,
        )
    except BundleError as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return 1
    print(
        f"Imported {done.files} files ({_human(done.size)}, llmgw {done.llmgw_version}) into "
        f"{done.mirror}"
    )
    print("Serve it to the nodes with `offline: {mirror: true}` in server.yaml.")
    return 0


def cmd_mirror_serve(args: argparse.Namespace) -> int:
    import logging
    import signal

    from llmgw.offline.mirrorpeer import serve

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(Path(args.dir), args.listen, args.follow, stop)

    asyncio.run(run())
    return 0


def add_parsers(roles: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``bundle create`` and ``bundle import``, under the top-level subparsers."""
    bundle = roles.add_parser("bundle", help="offline bundles: llmgw, engines and models")
    sub = bundle.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = sub.add_parser(
        "create", help="gather this llmgw's release, engine builds and model files, checked"
    )
    p.add_argument(
        "-o", "--output", required=True, help="a new directory, or FILE.tar for one file"
    )
    p.add_argument(
        "--models", nargs="+", metavar="SOURCE", help="hf:ORG/REPO[:QUANT|:PATH] sources"
    )
    p.add_argument(
        "--engines",
        nargs="*",
        default=["llama.cpp"],
        metavar="ENGINE",
        help="engines whose pinned release archives go in (default llama.cpp; none: --engines)",
    )
    p.add_argument(
        "--platform",
        action="append",
        metavar="TAG",
        help="a platform to bundle for, like py311-linux-x86_64 (repeat; default this one)",
    )
    p.add_argument(
        "--engine-build",
        action="append",
        choices=("cpu", "cuda"),
        help="llama.cpp builds to bundle (repeat; default cpu)",
    )
    p.add_argument("--llmgw-source", metavar="URL", help="llmgw's release source")
    p.add_argument("--llmgw-version", help=f"the llmgw release to bundle (default {__version__})")
    p.add_argument("--engine-source", metavar="URL", help="llama.cpp's release source")
    p.add_argument(
        "--hub",
        metavar="URL",
        default=os.environ.get("HF_ENDPOINT"),
        help="Hugging Face endpoint (default HF_ENDPOINT, else huggingface.co)",
    )
    p.add_argument(
        "--data-dir", help="a control plane's data dir: its releases.source and engines pins"
    )
    p.set_defaults(handler=cmd_create)
    p = sub.add_parser("import", help="check a bundle whole, then fill the control plane's mirror")
    p.add_argument("path", help="the bundle: a directory or a .tar")
    p.add_argument("--data-dir", help="the control plane's data dir (or LLMGW_DATA_DIR)")
    p.add_argument(
        "--manifest-sha256", metavar="HEX", help="the manifest digest `bundle create` printed"
    )
    p.set_defaults(handler=cmd_import)

    mirror = roles.add_parser("mirror", help="a model mirror on this node (mirror.api, peers)")
    sub = mirror.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = sub.add_parser("serve", help="serve a mirror directory at /mirror/, following another")
    p.add_argument("--dir", required=True, help="the mirror's directory")
    p.add_argument("--listen", default="0.0.0.0:8090", help="HOST:PORT (default 0.0.0.0:8090)")
    p.add_argument(
        "--follow",
        metavar="URL",
        help="keep in step with the mirror at URL (http://CP:8080) every 15 s",
    )
    p.set_defaults(handler=cmd_mirror_serve)
