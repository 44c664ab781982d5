"""An engine's OS packages, installed from the machine's own package sources.

The fleet names them per package manager (``packages:`` of an engine in server.yaml's
``engines:``, or ``ctl engines set``): ``apt`` on Debian and Ubuntu, ``dnf`` on
RHEL-likes. Before an engine is installed, the node asks its package database which
of the names for its manager are missing (``dpkg-query``, ``rpm -q``) and installs
those (``apt-get install``, after an ``apt-get update`` when the lists do not know a
name; ``dnf install``). Nothing is installed that is already there, and names for
another manager are not this machine's.

When it cannot (the agent is not root, no package source answers, a name is not
known), the engine's install fails with an error naming the packages and the command
to run by hand; the convergence tries again later, as for any failed install.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from llmgw.agent import command
from llmgw.agent.engines.install import InstallError

log = logging.getLogger("llmgw.agent.engines")

Manager = Literal["apt", "dnf"]
# What each manager needs on PATH: the installer and the package database's reader.
_TOOLS: dict[Manager, tuple[str, str]] = {"apt": ("apt-get", "dpkg-query"), "dnf": ("dnf", "rpm")}
QUERY_TIMEOUT = 30.0
INSTALL_TIMEOUT = 900.0
# apt-get and dpkg never ask a question of the agent (it has no terminal).
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}


class OsPackageError(InstallError):
    """An engine's OS packages could not be installed: which, why, and what to run."""


def by_hand(manager: Manager, names: Sequence[str]) -> str:
    """The command an operator runs on the node to install ``names``."""
    if manager == "apt":
        return f"sudo apt-get install -y {' '.join(names)}"
    return f"sudo dnf install -y {' '.join(names)}"


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "; ".join(kept[-lines:]) or "no output"


class OsPackages:
    def __init__(
        self,
        *,
        is_root: Callable[[], bool] = lambda: os.geteuid() == 0,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.is_root = is_root
        self.which = which

    def manager(self) -> Manager | None:
        """This machine's package manager: apt where apt-get and dpkg are, else dnf
        where dnf and rpm are; None for neither."""
        for manager, tools in _TOOLS.items():
            if all(self.which(tool) for tool in tools):
                return manager
        return None

    async def missing(self, manager: Manager, names: Sequence[str]) -> list[str]:
        """Those of ``names`` the package database does not hold installed."""
        out: list[str] = []
        for name in names:
            if manager == "apt":
                argv = ["dpkg-query", "-W", "-f=${Status}", name]
            else:
                argv = ["rpm", "-q", name]
            try:
                done = await command.run(argv, QUERY_TIMEOUT, stderr="drop")
            except OSError as exc:
                raise OsPackageError(f"{argv[0]} could not be asked about {name}: {exc}") from None
            there = done.code == 0 and (manager == "dnf" or "install ok installed" in done.out)
            if not there:
                out.append(name)
        return out

    async def ensure(
        self, engine: str, packages: Mapping[str, Sequence[str]], report: Callable[[str], None]
    ) -> list[str]:
        """Install what ``engine``'s packages for this machine's manager lack; returns
        the names installed. OsPackageError naming them, and the command, when it
        cannot."""
        wanted = {m: list(n) for m, n in packages.items() if n}
        if not wanted:
            return []
        manager = self.manager()
        if manager is None:
            named = "; ".join(f"{m}: {' '.join(n)}" for m, n in sorted(wanted.items()))
            raise OsPackageError(
                f"{engine} needs OS packages ({named}) and this machine has neither apt-get "
                "nor dnf: install them (or their equivalents) by hand"
            )
        names = wanted.get(manager, [])
        if not names:
            return []
        missing = await self.missing(manager, names)
        if not missing:
            return []
        listed = ", ".join(missing)
        if not self.is_root():
            raise OsPackageError(
                f"{engine} needs the OS package(s) {listed}, not installed, and this agent "
                f"is not root to install them: run `{by_hand(manager, missing)}` on this node"
            )
        report(f"installing OS package(s) {listed} with {_TOOLS[manager][0]}")
        log.info("%s: installing OS package(s) %s with %s", engine, listed, manager)
        problem = await self._install(manager, missing)
        if problem is None:
            left = await self.missing(manager, missing)
            if left:
                problem = f"{', '.join(left)} still not installed afterwards"
        if problem is not None:
            raise OsPackageError(
                f"{engine} needs the OS package(s) {listed} and {_TOOLS[manager][0]} could not "
                f"install them ({problem}): run `{by_hand(manager, missing)}` on this node "
                "(can it reach its package sources?)"
            )
        return missing

    async def _install(self, manager: Manager, names: list[str]) -> str | None:
        """None when the manager installed ``names``; else its last words."""
        if manager == "dnf":
            return await self._run(["dnf", "install", "-y", *names], {})
        install = ["apt-get", "install", "-y", "--no-install-recommends", *names]
        first = await self._run(install, APT_ENV)
        if first is None:
            return None
        # The package lists may be missing or stale (a fresh image has none): read
        # them once, then try again.
        updated = await self._run(["apt-get", "update"], APT_ENV)
        if updated is not None:
            return f"apt-get update: {updated}"
        return await self._run(install, APT_ENV)

    async def _run(self, argv: list[str], env: Mapping[str, str]) -> str | None:
        try:
            done = await command.run(argv, INSTALL_TIMEOUT, env=env)
        except TimeoutError:
            return f"no end after {INSTALL_TIMEOUT:g} s"
        except OSError as exc:
            return str(exc)
        if done.code != 0:
            return f"exit {done.code}: {_tail(done.out)}"
        return None
