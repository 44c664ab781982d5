"""keepalived for ``server add --vip``: the address that follows the leading control
plane. Each control plane's keepalived asks its own ``GET /leader`` (200 on the leader,
503 on a standby); a yes adds ``weight`` to a priority all share, so the leader bids
highest. Preemption stays on (no ``nopreempt``): when leadership moves while the
address's holder still runs, the new leader's bid must take it. With no leader (SQLite,
before ``server promote``) all bid alike and the address stays on a standby, serving /v1.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import zlib
from dataclasses import dataclass

from llmgw.client.remote import NodeAddError

KEEPALIVED_DIR = "/etc/keepalived"
KEEPALIVED_MARK = "# written by `llmgw server add`"
# The names the leader accepts for a control plane (the server's admission rule).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# A Linux interface name (15 characters at most); it lands unquoted in keepalived.conf.
_IFNAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
# The check URL lands inside a quoted keepalived string: plain characters only.
_CHECK_URL_RE = re.compile(r"http://[A-Za-z0-9.:\[\]-]+/leader")
# Exits 0 on 200, 1 on anything else (urlopen raises on 503 and on a refused connection);
# the URL comes as an argument, so the code needs no quotes of its own inside keepalived's.
_CHECK_PY = "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)"


class ServerAddError(NodeAddError):
    """A step of ``server add`` failed; the message says what to do."""


@dataclass(frozen=True)
class Vip:
    """The address that follows the leader, where it goes, and its VRRP group."""

    address: ipaddress.IPv4Interface
    interface: str
    router_id: int


def parse_vip(text: str, interface: str | None, router_id: int | None = None) -> Vip:
    if not interface:
        raise ServerAddError("--vip needs --interface IF: the interface it goes on (eth0, ...)")
    if not _IFNAME_RE.fullmatch(interface):
        raise ServerAddError(f"--interface {interface!r}: not an interface name (eth0, ...)")
    if "/" not in text:
        raise ServerAddError(f"--vip {text!r}: give its prefix length, as in 10.0.0.100/24")
    try:
        address = ipaddress.IPv4Interface(text)
    except ValueError as exc:
        raise ServerAddError(
            f"--vip {text!r}: not an IPv4 address with a prefix length ({exc}); "
            "IPv6 addresses are not supported yet"
        ) from None
    net = address.network
    if net.prefixlen < 31 and address.ip in (net.network_address, net.broadcast_address):
        raise ServerAddError(f"--vip {text}: that is the network's own or broadcast address")
    # Every control plane derives the same group from the address; --vrid when another
    # VRRP group on the network has it.
    if router_id is None:
        router_id = zlib.crc32(str(address.ip).encode()) % 255 + 1
    if not 1 <= router_id <= 255:
        raise ServerAddError(f"--vrid {router_id}: VRRP router ids run from 1 to 255")
    return Vip(address, interface, router_id)


def keepalived_conf(
    vip: Vip, *, name: str, check_url: str, priority: int = 100, weight: int = 50
) -> str:
    """keepalived.conf for the control plane ``name``, whose ``/leader`` is ``check_url``.

    Every control plane gets the same ``priority``; the check's ``weight`` must lift the
    leader above all of them, and stay within VRRP's 254."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"control plane name {name!r} is not valid")
    if not _CHECK_URL_RE.fullmatch(check_url):
        raise ValueError(f"check URL {check_url!r} is not http://HOST:PORT/leader")
    if not (0 < weight and 0 < priority and priority + weight <= 254):
        raise ValueError(f"priority {priority} and weight {weight}: need 0 < each, sum <= 254")
    return f"""\
{KEEPALIVED_MARK} for control plane {name}.
# {vip.address.ip} is where the leading control plane is: each control plane's keepalived
# asks its own /leader (200 on the leader, 503 on a standby), and a yes adds {weight} to the
# priority all share, so the leader bids highest. Preemption stays on (no nopreempt):
# when leadership moves while the address's holder still runs, the new leader takes it.
global_defs {{
    router_id llmgw-{name}
    enable_script_security
    script_user nobody
}}

vrrp_script llmgw_leader {{
    script "/usr/bin/env python3 -c '{_CHECK_PY}' {check_url}"
    interval 2
    timeout 3
    rise 2
    fall 2
    weight {weight}
}}

vrrp_instance llmgw {{
    state BACKUP
    interface {vip.interface}
    virtual_router_id {vip.router_id}
    priority {priority}
    advert_int 1
    virtual_ipaddress {{
        {vip.address} dev {vip.interface}
    }}
    track_script {{
        llmgw_leader
    }}
}}
"""


def keepalived_script(directory: str = KEEPALIVED_DIR) -> str:
    """Shell that takes keepalived.conf on stdin, puts it in ``directory`` and (only for
    the system's own directory) restarts keepalived; it prints what it did."""
    q = shlex.quote
    d = directory.rstrip("/") or "/"
    conf, ours, new = q(f"{d}/keepalived.conf"), q(f"{d}/llmgw.conf"), q(f"{d}/.llmgw.conf.new")
    system = q(f"{KEEPALIVED_DIR}/keepalived.conf")
    # A keepalived.conf we did not write is someone's own: left alone, ours goes beside it.
    return f"""\
set -e
PATH="$PATH:/usr/sbin:/sbin"
mkdir -p {q(d)}
cat > {new}
chmod 644 {new}
target={conf}
if [ -f {conf} ] && ! grep -qF {q(KEEPALIVED_MARK)} {conf}; then target={ours}; fi
mv -f {new} "$target"
echo "written=$target"
if ! command -v keepalived >/dev/null 2>&1; then
  echo keepalived=absent
elif [ "$target" != {system} ]; then
  echo keepalived=untouched
elif [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl enable --quiet keepalived 2>/dev/null || true
  systemctl restart keepalived
  echo keepalived=restarted
elif [ -f /run/keepalived.pid ] && kill -HUP "$(cat /run/keepalived.pid)" 2>/dev/null; then
  echo keepalived=reloaded
else
  keepalived
  echo keepalived=started
fi
"""


def keepalived_outcome(output: str, where: str) -> str:
    """What ``keepalived_script`` did, in a sentence for the operator."""
    said = dict(line.partition("=")[::2] for line in output.splitlines() if "=" in line)
    written, state = said.get("written", "?"), said.get("keepalived", "?")
    if state == "absent":
        return (
            f"wrote {written}; keepalived is not installed on {where}: install it "
            "(apt-get install keepalived) and it takes this configuration when it starts"
        )
    if state == "untouched":
        return (
            f"{where} has a keepalived.conf of its own, left as it was: wrote {written}; "
            f"add `include {written}` to it and restart keepalived"
        )
    return f"wrote {written}; keepalived {state} on {where}"
