"""A real OpenLDAP server for tests: Debian's ``slapd`` (package slapd, which ``make
test`` installs with ldap-utils), run as its own process on 127.0.0.1 and a free port,
with a ``slapd.conf`` and an MDB database made under a temporary folder and filled by
``slapadd`` before it starts. It runs in the foreground (``-d 0``) so the fixture owns
its process and ends it by its id.

The directory (``DIRECTORY``) is small and fixed: three people, a service account the
control plane binds as, and groups, two of them nested (engineering holds ml-engineers,
cluster-admins holds ops) and two holding each other (a loop the group walk must
survive).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmgw import pki

SLAPD = Path(os.environ.get("LLMGW_SLAPD", "/usr/sbin/slapd"))
SLAPADD = Path(os.environ.get("LLMGW_SLAPADD", "/usr/sbin/slapadd"))
SCHEMA = Path("/etc/ldap/schema")
MODULES = Path("/usr/lib/ldap")

BASE = "dc=example,dc=org"
# The directory's own administrator: tests change groups as it, as an IdP's admin would.
ROOT_DN = f"cn=root,{BASE}"
ROOT_PASSWORD = "root-secret-9c1e"
SERVICE_DN = f"cn=llmgw,ou=service,{BASE}"
SERVICE_PASSWORD = "reader-secret-7f3a"
PEOPLE = f"ou=people,{BASE}"
GROUPS = f"ou=groups,{BASE}"
# login -> password
PASSWORDS = {"alice": "alice-pw-1", "bob": "bob-pw-2", "carol": "carol-pw-3"}


def dn(login: str) -> str:
    return f"uid={login},{PEOPLE}"


def group(name: str) -> str:
    return f"cn={name},{GROUPS}"


def _entry(dn_: str, *lines: str) -> str:
    return "\n".join([f"dn: {dn_}", *lines]) + "\n"


def _person(login: str, name: str, mail: str) -> str:
    return _entry(
        dn(login),
        "objectClass: inetOrgPerson",
        f"uid: {login}",
        f"cn: {name}",
        f"sn: {name.split()[-1]}",
        f"displayName: {name}",
        f"mail: {mail}",
        f"userPassword: {PASSWORDS[login]}",
    )


def _group(name: str, *members: str) -> str:
    return _entry(
        group(name),
        "objectClass: groupOfNames",
        f"cn: {name}",
        *(f"member: {m}" for m in members),
    )


DIRECTORY = "\n".join(
    [
        _entry(
            BASE, "objectClass: dcObject", "objectClass: organization", "o: Example", "dc: example"
        ),
        _entry(PEOPLE, "objectClass: organizationalUnit", "ou: people"),
        _entry(GROUPS, "objectClass: organizationalUnit", "ou: groups"),
        _entry(f"ou=service,{BASE}", "objectClass: organizationalUnit", "ou: service"),
        _entry(
            SERVICE_DN,
            "objectClass: organizationalRole",
            "objectClass: simpleSecurityObject",
            "cn: llmgw",
            f"userPassword: {SERVICE_PASSWORD}",
        ),
        _person("alice", "Alice Liddell", "alice@example.org"),
        _person("bob", "Bob Builder", "bob@example.org"),
        _person("carol", "Carol Danvers", "carol@example.org"),
        _group("ml-engineers", dn("alice")),
        _group("engineering", group("ml-engineers"), dn("carol")),
        _group("ops", dn("bob")),
        _group("cluster-admins", group("ops")),
        _group("loop-a", dn("alice"), group("loop-b")),
        _group("loop-b", group("loop-a")),
    ]
)

CONF = """\
include {schema}/core.schema
include {schema}/cosine.schema
include {schema}/inetorgperson.schema
include {schema}/nis.schema
modulepath {modules}
moduleload back_mdb
pidfile {root}/slapd.pid
loglevel none
# As Active Directory and many servers do: a DN with an empty password binds, as
# nobody (an "unauthenticated bind"), so the tests show llmgw refusing it itself.
allow bind_anon_dn

database mdb
maxsize 16777216
suffix "{base}"
rootdn "{root_dn}"
rootpw {root_password}
directory {root}/db

TLSCACertificateFile {root}/ca.crt
TLSCertificateFile {root}/server.crt
TLSCertificateKeyFile {root}/server.key

access to attrs=userPassword
    by anonymous auth
    by * none
access to *
    by users read
    by * none
"""


def missing() -> str | None:
    """Why slapd cannot be started here, or None when it can."""
    absent = [str(p) for p in (SLAPD, SLAPADD) if not os.access(p, os.X_OK)]
    if absent or not (SCHEMA / "inetorgperson.schema").exists():
        return (
            f"OpenLDAP's slapd is not installed ({', '.join(absent) or SCHEMA} missing): run "
            "`make apt`, which installs the Debian packages the tests need (slapd, ldap-utils)"
        )
    return None


@dataclass(frozen=True)
class Slapd:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    root: Path
    # The same directory over TLS from the start, its certificate for 127.0.0.1 issued
    # by ``ca_pem`` (made for this run).
    ldaps_url: str = ""
    ca_pem: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def running(timeout: float = 20.0) -> Iterator[Slapd]:
    """slapd serving ``DIRECTORY`` until the block ends."""
    root = Path(tempfile.mkdtemp(prefix="llmgw-slapd-"))
    try:
        (root / "db").mkdir()
        conf = root / "slapd.conf"
        conf.write_text(
            CONF.format(
                schema=SCHEMA,
                modules=MODULES,
                root=root,
                base=BASE,
                root_dn=ROOT_DN,
                root_password=ROOT_PASSWORD,
            )
        )
        ca = pki.make_ca("slapd-test")
        issued = pki.make_server_cert(ca, ["127.0.0.1", "localhost"])
        (root / "ca.crt").write_bytes(ca.cert_pem)
        (root / "server.crt").write_bytes(issued.cert_pem)
        (root / "server.key").write_bytes(issued.key_pem)
        ldif = root / "directory.ldif"
        ldif.write_text(DIRECTORY)
        subprocess.run(
            [str(SLAPADD), "-f", str(conf), "-l", str(ldif)],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        port, tls_port = _free_port(), _free_port()
        url, ldaps = f"ldap://127.0.0.1:{port}", f"ldaps://127.0.0.1:{tls_port}"
        process = subprocess.Popen(
            [str(SLAPD), "-f", str(conf), "-h", f"{url}/ {ldaps}/", "-d", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + timeout
            while not (_answers(port) and _answers(tls_port)):
                if process.poll() is not None:
                    err = process.stderr.read().decode() if process.stderr else ""
                    raise RuntimeError(f"slapd ended with {process.returncode}: {err}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"slapd did not answer on {url} within {timeout:g} s")
                time.sleep(0.05)
            yield Slapd(url, port, process, root, ldaps, ca.cert_pem.decode())
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stderr:
                process.stderr.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def set_members(server: Slapd, name: str, members: list[str]) -> None:
    """Make ``members`` (DNs) the members of group ``name``, as the directory's admin."""
    import ldap3

    conn = ldap3.Connection(
        ldap3.Server(server.url), ROOT_DN, ROOT_PASSWORD, auto_bind=True, receive_timeout=5
    )
    try:
        if not conn.modify(group(name), {"member": [(ldap3.MODIFY_REPLACE, members)]}):
            raise RuntimeError(f"changing {name}'s members failed: {conn.result}")
    finally:
        conn.unbind()
