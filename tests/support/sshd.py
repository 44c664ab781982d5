"""A real sshd on loopback for the tests of ``node add`` and ``server add``.

Debian's sshd, started with its own host key and an authorized key made here; the
machine it reaches is this one, so what it installs runs from the zipapp under the
python3 an ssh login finds, the way it would on a fresh machine.
"""

from __future__ import annotations

import getpass
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import stop_process

SSHD = Path("/usr/sbin/sshd")


@dataclass
class Sshd:
    port: int
    key: Path
    known_hosts: Path
    user: str
    popen: subprocess.Popen[bytes]
    log: Path

    def ssh_args(self) -> list[str]:
        """The ssh flags ``node add`` and ``server add`` take to log in here."""
        return [
            "--user",
            self.user,
            "--ssh-port",
            str(self.port),
            "--ssh-key",
            str(self.key),
            # Keeps the test's throwaway host keys out of the user's known_hosts.
            "--ssh-option",
            f"UserKnownHostsFile={self.known_hosts}",
        ]

    def node_add_args(self, *extra: str) -> list[str]:
        return ["node", "add", "127.0.0.1", *self.ssh_args(), *extra]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def running_sshd(root: Path, port: int) -> Iterator[Sshd]:
    """An sshd on 127.0.0.1:``port`` with its keys and config under ``root``; stopped
    on the way out."""
    root.mkdir()
    for name in ("host_key", "user_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True
        )
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    config = root / "sshd_config"
    config.write_text(
        f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {root / "host_key"}
AuthorizedKeysFile {root / "authorized_keys"}
PidFile {root / "sshd.pid"}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
"""
    )
    # sshd refuses to start without its privilege-separation directory.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = root / "sshd.log"
    with log.open("w") as fh:
        popen = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            start_new_session=True,
        )
    server = Sshd(port, root / "user_key", root / "known_hosts", getpass.getuser(), popen, log)
    try:
        deadline = time.monotonic() + 10
        while not listening(port):
            assert popen.poll() is None, "sshd exited:\n" + log.read_text()
            assert time.monotonic() < deadline, "sshd did not listen:\n" + log.read_text()
            time.sleep(0.1)
        yield server
    finally:
        stop_process(popen)
