"""The engines a fleet runs, as the control plane names them and every agent reads them:
an engine, its version, and what checks its files.

``engines:`` in server.yaml (and ``llmgw ctl engines set``) maps an engine to a version
or to a map::

    engines:
      llama.cpp: b6000                  # or {version: b6000, sha256: {ASSET: HEX}}
      vllm: {version: 0.11.0, index_url: https://pypi.example/simple}
      llama.cpp: {version: b6000, packages: {apt: [libgomp1], dnf: [libgomp]}}

``sha256`` pins the digest of each release archive by its file name, so a node checks
what it downloads against what the operator named and not only against what the release
source publishes beside it. ``index_url`` is the package index vLLM, SGLang, FreeToken
and TensorRT-LLM are installed from (PyPI when unset). ``packages`` names the OS
packages the engine needs, per package manager (``apt`` on Debian and Ubuntu, ``dnf``
on RHEL-likes): each node installs the missing ones from its own package sources
before the engine (``agent/engines/ospackages.py``).

Unset, a fleet runs ``PINNED``: the llama.cpp release this llmgw release names, so a
"latest" never changes a fleet behind its operator's back. Its digests are filled in at
release time (``packaging/pin-engines.py`` reads them from GitHub's API); a digest not
read is absent, and the node then checks the one GitHub publishes for the asset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypedDict

ENGINES = ("llama.cpp", "vllm", "sglang", "freetoken", "tensorrt-llm")
# Per node: which build of an engine to install. ``none`` installs nothing there.
BUILDS = ("auto", "cu13", "cu129", "cpu", "none")
PYTHON_ENGINES = ("vllm", "sglang", "freetoken", "tensorrt-llm")
# The package managers an engine's OS packages are named for.
MANAGERS = ("apt", "dnf")

# The llama.cpp release this llmgw names by default (release archives on GitHub).
LLAMACPP_PIN = "b10598"
PINNED: dict[str, dict[str, Any]] = {"llama.cpp": {"version": LLAMACPP_PIN, "sha256": {}}}

_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}\Z")
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}\Z")
_ASSET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}\Z")
# A Debian or RPM package name (never an option: it starts with a letter or digit).
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}\Z")


class EngineWant(TypedDict, total=False):
    """One engine as the fleet names it to a node (``WantedEngines.engines``), as the
    agent reads it: each part is left out when absent or not of its kind."""

    version: str
    sha256: dict[str, str]  # release archive's file name -> hex digest
    index_url: str | None
    packages: dict[str, list[str]]  # package manager (apt, dnf) -> OS package names


def want_of(value: Mapping[str, object]) -> EngineWant:
    """What an agent takes of one engine's entry in the fleet's message."""
    out: EngineWant = {}
    version = value.get("version")
    if isinstance(version, str):
        out["version"] = version
    digests = value.get("sha256")
    if isinstance(digests, dict):
        out["sha256"] = {str(k): str(v) for k, v in digests.items()}
    if "index_url" in value:
        index = value["index_url"]
        out["index_url"] = index if isinstance(index, str) else None
    packages = value.get("packages")
    if isinstance(packages, dict):
        out["packages"] = {
            str(manager): [str(n) for n in names]
            for manager, names in packages.items()
            if isinstance(names, list)
        }
    return out


class PinError(ValueError):
    """An engine, version or digest the fleet cannot name; says which and why."""


def pinned() -> dict[str, dict[str, Any]]:
    """A fresh copy of the default (callers may change theirs)."""
    return {name: {**want, "sha256": dict(want["sha256"])} for name, want in PINNED.items()}


def normalise_version(engine: str, version: str) -> str:
    """llama.cpp's ``6000`` as its tag ``b6000``; other engines' versions as given."""
    version = version.strip()
    if engine == "llama.cpp" and version.isdigit():
        version = f"b{version}"
    if not _VERSION.match(version):
        raise PinError(
            f"{engine}: {version!r} is not a version (like b6000 for llama.cpp, 0.11.0 for vLLM)"
        )
    return version


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise PinError(f"{name!r} is not an engine llmgw runs (it runs {', '.join(ENGINES)})")
    return name


def check_build(build: str) -> str:
    if build not in BUILDS:
        raise PinError(f"{build!r} is not a build (choose {', '.join(BUILDS)})")
    return build


def parse_want(name: str, value: object) -> dict[str, Any]:
    """One engine's entry (a version, or a map of version, sha256 and index_url) as the
    map every reader takes; PinError naming the engine and what is wrong."""
    check_engine(name)
    if isinstance(value, str | int) and not isinstance(value, bool):
        value = {"version": str(value)}
    if not isinstance(value, Mapping):
        raise PinError(f"{name}: give a version or a map with version, sha256, index_url")
    unknown = sorted(set(value) - {"version", "sha256", "index_url", "packages"})
    if unknown:
        raise PinError(
            f"{name}: unknown key(s) {', '.join(unknown)} (version, sha256, index_url, packages)"
        )
    version = value.get("version")
    if not isinstance(version, str | int) or isinstance(version, bool):
        raise PinError(f"{name}: version is missing")
    digests = value.get("sha256") or {}
    if not isinstance(digests, Mapping):
        raise PinError(f"{name}: sha256 maps each release archive's file name to its digest")
    checked: dict[str, str] = {}
    for asset, digest in digests.items():
        if not isinstance(asset, str) or not _ASSET.match(asset):
            raise PinError(f"{name}: {asset!r} is not a release archive's file name")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise PinError(f"{name}: the sha256 of {asset} must be 64 hex digits")
        checked[asset] = digest.lower()
    index = value.get("index_url")
    if index is not None:
        if name not in PYTHON_ENGINES:
            raise PinError(
                f"{name}: index_url is for vLLM, SGLang, FreeToken and TensorRT-LLM, "
                "installed from a package index"
            )
        if not isinstance(index, str) or not re.match(r"^https?://[^\s]+\Z", index):
            raise PinError(f"{name}: index_url must be an http(s) URL, not {index!r}")
    out: dict[str, Any] = {
        "version": normalise_version(name, str(version)),
        "sha256": checked,
        "index_url": index,
    }
    packages = parse_packages(name, value.get("packages"))
    if packages:
        out["packages"] = packages
    return out


def parse_packages(name: str, value: object) -> dict[str, list[str]]:
    """An engine's OS packages, ``{apt: [NAME...], dnf: [NAME...]}``; PinError naming
    what is wrong."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PinError(
            f"{name}: packages maps a package manager ({', '.join(MANAGERS)}) to package "
            "names, like {apt: [libgomp1], dnf: [libgomp]}"
        )
    out: dict[str, list[str]] = {}
    for manager, names in value.items():
        if manager not in MANAGERS:
            raise PinError(
                f"{name}: packages: {manager!r} is not a package manager llmgw uses "
                f"({', '.join(MANAGERS)})"
            )
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list | tuple):
            raise PinError(f"{name}: packages: {manager} takes a list of package names")
        for package in names:
            if not isinstance(package, str) or not _PACKAGE.match(package):
                raise PinError(f"{name}: packages: {package!r} is not a package name")
        if names:
            out[str(manager)] = [str(n) for n in names]
    return out


def parse_wanted(data: Mapping[str, object]) -> dict[str, dict[str, Any]]:
    """A whole ``engines:`` map; an entry set to null names no version of that engine."""
    return {
        str(name): parse_want(str(name), value) for name, value in data.items() if value is not None
    }
