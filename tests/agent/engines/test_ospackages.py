"""An engine's OS packages installed from the machine's own package sources, with
stand-in apt-get, dpkg-query, dnf and rpm first on PATH (no real package is ever
installed): the missing ones installed, the rest left alone, the lists read again when
they do not know a name, and a clear error naming the packages and the command to run
by hand when the agent is not root or no package source answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmgw.agent.engines.ospackages import OsPackageError, OsPackages

# Each stand-in keeps what it was asked in $LOG; $STATE holds a file per installed
# package and, in .mode, how the package sources behave: ok, stale (apt's lists must be
# read first) or offline. Shell builtins only: PATH may hold nothing else.
DPKG_QUERY = r"""#!/bin/sh
echo "dpkg-query $*" >> "$LOG"
if [ -e "$STATE/$3" ]; then printf "install ok installed"; exit 0; fi
echo "dpkg-query: no packages found matching $3" >&2
exit 1
"""
APT_GET = r"""#!/bin/sh
echo "apt-get $* DEBIAN_FRONTEND=$DEBIAN_FRONTEND" >> "$LOG"
read -r mode < "$STATE/.mode" || mode=ok
case "$1" in
update)
  if [ "$mode" = offline ]; then
    echo "Err:1 http://deb.debian.org/debian bookworm InRelease"
    echo "  Temporary failure resolving 'deb.debian.org'"
    exit 100
  fi
  : > "$STATE/.updated"; exit 0;;
install)
  if [ "$mode" = offline ] || { [ "$mode" = stale ] && [ ! -e "$STATE/.updated" ]; }; then
    echo "Reading package lists..."
    for a in "$@"; do
      case "$a" in install|-*) ;; *) echo "E: Unable to locate package $a";; esac
    done
    exit 100
  fi
  for a in "$@"; do case "$a" in install|-*) ;; *) : > "$STATE/$a";; esac; done
  exit 0;;
esac
exit 64
"""
RPM = r"""#!/bin/sh
echo "rpm $*" >> "$LOG"
if [ -e "$STATE/$2" ]; then echo "$2-1.0-1.x86_64"; exit 0; fi
echo "package $2 is not installed"
exit 1
"""
DNF = r"""#!/bin/sh
echo "dnf $*" >> "$LOG"
read -r mode < "$STATE/.mode" || mode=ok
if [ "$mode" = offline ]; then
  echo "Error: Failed to download metadata for repo 'baseos'"; exit 1
fi
for a in "$@"; do case "$a" in install|-*) ;; *) : > "$STATE/$a";; esac; done
exit 0
"""


class Machine:
    """The stand-in tools, their state and what they were asked."""

    def __init__(self, root: Path, tools: dict[str, str], monkeypatch: pytest.MonkeyPatch):
        self.bin = root / "bin"
        self.state = root / "state"
        self.log = root / "asked.log"
        self.bin.mkdir(parents=True)
        self.state.mkdir()
        for name, text in tools.items():
            tool = self.bin / name
            tool.write_text(text)
            tool.chmod(0o755)
        monkeypatch.setenv("STATE", str(self.state))
        monkeypatch.setenv("LOG", str(self.log))
        # The stand-ins first: a real apt-get or dnf is never reached.
        monkeypatch.setenv("PATH", f"{self.bin}:/usr/bin:/bin")
        self.mode("ok")

    def mode(self, mode: str) -> None:
        (self.state / ".mode").write_text(mode + "\n")

    def installed(self, *names: str) -> None:
        for name in names:
            (self.state / name).touch()

    def asked(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def packages(self, *, root: bool = True) -> OsPackages:
        # Only the stand-ins say which package manager this machine has.
        return OsPackages(
            is_root=lambda: root, which=lambda tool: shutil.which(tool, path=str(self.bin))
        )


@pytest.fixture
def debian(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    return Machine(tmp_path, {"apt-get": APT_GET, "dpkg-query": DPKG_QUERY}, monkeypatch)


@pytest.fixture
def rhel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    return Machine(tmp_path, {"dnf": DNF, "rpm": RPM}, monkeypatch)


WANTED = {"apt": ["libgomp1", "libstdc++6"], "dnf": ["libgomp"]}
QUERY = "dpkg-query -W -f=${Status} "
INSTALL = "apt-get install -y --no-install-recommends "


async def test_the_missing_packages_are_installed_and_the_rest_left_alone(
    debian: Machine,
) -> None:
    debian.installed("libstdc++6")
    said: list[str] = []
    assert await debian.packages().ensure("llama.cpp", WANTED, said.append) == ["libgomp1"]
    assert debian.asked() == [
        QUERY + "libgomp1",
        QUERY + "libstdc++6",
        INSTALL + "libgomp1 DEBIAN_FRONTEND=noninteractive",
        QUERY + "libgomp1",
    ]
    assert said == ["installing OS package(s) libgomp1 with apt-get"]

    # Everything there: asked, and nothing installed.
    again: list[str] = []
    assert await debian.packages().ensure("llama.cpp", WANTED, again.append) == []
    assert not [a for a in debian.asked()[4:] if a.startswith("apt-get")] and again == []


async def test_lists_that_do_not_know_a_name_are_read_and_the_install_tried_again(
    debian: Machine,
) -> None:
    debian.mode("stale")
    assert await debian.packages().ensure("llama.cpp", WANTED, print) == [
        "libgomp1",
        "libstdc++6",
    ]
    assert [a for a in debian.asked() if a.startswith("apt-get")] == [
        INSTALL + "libgomp1 libstdc++6 DEBIAN_FRONTEND=noninteractive",
        "apt-get update DEBIAN_FRONTEND=noninteractive",
        INSTALL + "libgomp1 libstdc++6 DEBIAN_FRONTEND=noninteractive",
    ]


async def test_no_package_source_is_an_error_naming_the_packages_and_the_command(
    debian: Machine,
) -> None:
    debian.mode("offline")
    with pytest.raises(OsPackageError) as failed:
        await debian.packages().ensure("llama.cpp", {"apt": ["libgomp1"]}, print)
    words = str(failed.value)
    assert "llama.cpp needs the OS package(s) libgomp1" in words
    assert "Temporary failure resolving 'deb.debian.org'" in words
    assert "run `sudo apt-get install -y libgomp1` on this node" in words
    assert not (debian.state / "libgomp1").exists()


async def test_an_agent_that_is_not_root_says_what_to_run_and_installs_nothing(
    debian: Machine,
) -> None:
    with pytest.raises(OsPackageError) as failed:
        await debian.packages(root=False).ensure("llama.cpp", WANTED, print)
    assert str(failed.value) == (
        "llama.cpp needs the OS package(s) libgomp1, libstdc++6, not installed, and this "
        "agent is not root to install them: run `sudo apt-get install -y libgomp1 "
        "libstdc++6` on this node"
    )
    assert all(a.startswith("dpkg-query") for a in debian.asked())


async def test_a_rhel_like_machine_installs_the_names_for_dnf(rhel: Machine) -> None:
    assert await rhel.packages().ensure("llama.cpp", WANTED, print) == ["libgomp"]
    assert rhel.asked() == ["rpm -q libgomp", "dnf install -y libgomp", "rpm -q libgomp"]
    rhel.mode("offline")
    (rhel.state / "libgomp").unlink()
    with pytest.raises(OsPackageError, match=r"run `sudo dnf install -y libgomp`"):
        await rhel.packages().ensure("llama.cpp", WANTED, print)


async def test_names_only_for_another_manager_ask_nothing_here(rhel: Machine) -> None:
    assert await rhel.packages().ensure("llama.cpp", {"apt": ["libgomp1"]}, print) == []
    assert rhel.asked() == []


async def test_a_machine_with_neither_manager_says_so(tmp_path: Path) -> None:
    packages = OsPackages(is_root=lambda: True, which=lambda tool: None)
    with pytest.raises(OsPackageError, match="this machine has neither apt-get nor dnf"):
        await packages.ensure("llama.cpp", {"apt": ["libgomp1"]}, print)
    # Nothing named: nothing to have.
    assert await packages.ensure("llama.cpp", {}, print) == []
