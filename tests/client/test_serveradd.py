"""``server add``'s pieces without ssh: keepalived's configuration, the scripts it runs
on the new machine (run here, against a stand-in zipapp), and its refusals."""

from __future__ import annotations

import argparse
import http.server
import ipaddress
import json
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.client import keepalived, serveradd
from llmgw.client.keepalived import ServerAddError, Vip

VIP = Vip(ipaddress.IPv4Interface("10.0.0.100/24"), "eth0", 51)
CHECK = "http://127.0.0.1:8080/leader"
# Stands in for llmgw.pyz: says how it was called, and with what environment.
ECHO_PYZ = """\
import json, os, sys
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "argv.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "shiv_root": os.environ.get("SHIV_ROOT")}, f)
print("joined")
"""


def _line(conf: str, key: str) -> str:
    return next(line.strip() for line in conf.splitlines() if line.strip().startswith(key))


# --- keepalived -----------------------------------------------------------------------


def test_keepalived_conf_puts_the_address_on_the_interface_and_asks_leader() -> None:
    conf = keepalived.keepalived_conf(VIP, name="cp-b", check_url=CHECK)
    assert conf.startswith(keepalived.KEEPALIVED_MARK)
    assert _line(conf, "interface") == "interface eth0"
    assert "10.0.0.100/24 dev eth0" in conf
    assert _line(conf, "virtual_router_id") == "virtual_router_id 51"
    assert _line(conf, "router_id llmgw") == "router_id llmgw-cp-b"
    assert _line(conf, "state") == "state BACKUP"
    assert "track_script {\n        llmgw_leader\n    }" in conf
    # Preemption must stay on: a new leader takes the address from a standby that has it.
    assert "nopreempt" not in conf.replace("no nopreempt", "")
    assert conf.count("{") == conf.count("}")


def test_the_leaders_bid_is_above_every_standbys() -> None:
    conf = keepalived.keepalived_conf(VIP, name="cp-b", check_url=CHECK)
    priority = int(_line(conf, "priority").split()[1])
    weight = int(_line(conf, "weight").split()[1])
    # Every control plane shares the base priority; the check's success lifts the leader.
    assert weight > 0 and priority + weight > priority and priority + weight <= 254
    with pytest.raises(ValueError, match="sum <= 254"):
        keepalived.keepalived_conf(VIP, name="cp-b", check_url=CHECK, priority=250)


def test_the_check_script_line_splits_as_keepalived_splits_it() -> None:
    conf = keepalived.keepalived_conf(VIP, name="cp-b", check_url=CHECK)
    line = _line(conf, "script ")
    # One double-quoted string; inside it single quotes group the Python code.
    quoted = line.removeprefix("script ")
    assert quoted.startswith('"') and quoted.endswith('"') and quoted.count('"') == 2
    argv = shlex.split(quoted[1:-1])
    assert argv == ["/usr/bin/env", "python3", "-c", keepalived._CHECK_PY, CHECK]


class _Leader(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(self.status if self.path == "/leader" else 404)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def leader_url() -> Iterator[tuple[str, type[_Leader]]]:
    handler = type("Handler", (_Leader,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/leader", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_check_says_yes_on_200_and_no_on_503_or_nothing(
    leader_url: tuple[str, type[_Leader]],
) -> None:
    url, handler = leader_url
    conf = keepalived.keepalived_conf(VIP, name="cp-b", check_url=url)
    argv = shlex.split(_line(conf, "script ").removeprefix("script ")[1:-1])
    assert subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    handler.status = 503
    assert subprocess.run(argv, capture_output=True, timeout=10).returncode != 0
    closed = argv[:-1] + ["http://127.0.0.1:1/leader"]
    assert subprocess.run(closed, capture_output=True, timeout=10).returncode != 0


def test_listener_script_prints_the_status_or_none(
    leader_url: tuple[str, type[_Leader]],
) -> None:
    url, handler = leader_url

    def status(url: str) -> str:
        script = serveradd.listener_script(url)
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout.strip()

    assert status(url) == "200"
    handler.status = 503
    assert status(url) == "503"
    assert status("http://127.0.0.1:1/leader") == "none"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "cp b"}, "name 'cp b' is not valid"),
        ({"check_url": 'http://x"; rm -rf /"/leader'}, "is not http://HOST:PORT/leader"),
        ({"weight": 0}, "need 0 < each"),
    ],
)
def test_keepalived_conf_refuses_what_would_break_it(kwargs: dict[str, Any], message: str) -> None:
    given: dict[str, Any] = {"name": "cp-b", "check_url": CHECK, **kwargs}
    with pytest.raises(ValueError, match=message):
        keepalived.keepalived_conf(VIP, **given)


def test_parse_vip_derives_one_router_id_for_every_control_plane() -> None:
    vip = keepalived.parse_vip("10.0.0.100/24", "eth0")
    assert vip.address == ipaddress.IPv4Interface("10.0.0.100/24")
    assert 1 <= vip.router_id <= 255
    assert keepalived.parse_vip("10.0.0.100/24", "eth0") == vip
    assert keepalived.parse_vip("10.0.0.100/24", "bond0.12", router_id=7).router_id == 7


@pytest.mark.parametrize(
    ("vip", "interface", "router_id", "message"),
    [
        ("10.0.0.100/24", None, None, "--vip needs --interface IF"),
        ("10.0.0.100/24", "eth0; reboot", None, "not an interface name"),
        ("10.0.0.100/24", "a-very-long-ifname", None, "not an interface name"),
        ("10.0.0.100", "eth0", None, "give its prefix length"),
        ("10.0.0.300/24", "eth0", None, "not an IPv4 address"),
        ("fd00::10/64", "eth0", None, "IPv6 addresses are not supported yet"),
        ("10.0.0.0/24", "eth0", None, "network's own or broadcast"),
        ("10.0.0.100/24", "eth0", 256, "from 1 to 255"),
    ],
)
def test_parse_vip_refusals_say_what_to_give(
    vip: str, interface: str | None, router_id: int | None, message: str
) -> None:
    with pytest.raises(ServerAddError, match=message):
        keepalived.parse_vip(vip, interface, router_id)


def _keepalived(directory: Path, conf: str) -> dict[str, str]:
    done = subprocess.run(
        ["sh", "-c", keepalived.keepalived_script(str(directory))],
        input=conf,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def test_keepalived_script_writes_its_own_and_leaves_anothers_alone(tmp_path: Path) -> None:
    conf = keepalived.keepalived_conf(VIP, name="cp-b", check_url=CHECK)
    d = tmp_path / "keepalived"
    # A directory other than /etc/keepalived: written, and keepalived is never touched.
    said = _keepalived(d, conf)
    assert said["written"] == f"{d}/keepalived.conf"
    assert said["keepalived"] in ("untouched", "absent")
    assert (d / "keepalived.conf").read_text() == conf
    again = conf.replace("cp-b", "cp-c")
    assert _keepalived(d, again)["written"] == f"{d}/keepalived.conf"
    assert (d / "keepalived.conf").read_text() == again

    (d / "keepalived.conf").write_text("vrrp_instance theirs {}\n")
    said = _keepalived(d, conf)
    assert said["written"] == f"{d}/llmgw.conf"
    assert (d / "keepalived.conf").read_text() == "vrrp_instance theirs {}\n"
    assert (d / "llmgw.conf").read_text() == conf
    assert not list(d.glob(".llmgw*")), "no half-written file left behind"


def test_keepalived_outcomes_read_as_sentences() -> None:
    absent = keepalived.keepalived_outcome(
        "written=/etc/keepalived/keepalived.conf\nkeepalived=absent\n", "cp2"
    )
    assert "keepalived is not installed on cp2" in absent
    assert "apt-get install keepalived" in absent
    theirs = keepalived.keepalived_outcome(
        "written=/etc/keepalived/llmgw.conf\nkeepalived=untouched\n", "cp2"
    )
    assert "add `include /etc/keepalived/llmgw.conf` to it" in theirs
    done = keepalived.keepalived_outcome(
        "written=/etc/k/keepalived.conf\nkeepalived=restarted", "h"
    )
    assert done == "wrote /etc/k/keepalived.conf; keepalived restarted on h"


# --- the scripts run on the new machine -----------------------------------------------


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    path = tmp_path / "opt llmgw's"  # quoting is tested by the path as well
    path.mkdir()
    (path / "llmgw.pyz").write_text(ECHO_PYZ)
    return path


def _called(prefix: Path, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (prefix / "argv.json").exists():
        assert time.monotonic() < deadline, "the stand-in zipapp never ran"
        time.sleep(0.05)
    time.sleep(0.05)
    return json.loads((prefix / "argv.json").read_text())  # type: ignore[no-any-return]


def test_join_script_passes_every_flag_and_the_token_as_given(prefix: Path) -> None:
    flags = ["--server", "10.0.0.1:8080", "--name", "cp-b", "--advertise", "$(touch pwned) `x` 'y'"]
    script = serveradd.join_script(str(prefix), flags)
    token = "llmgw-server-1.abc$def"
    assert token not in script, "the token travels on stdin"
    done = subprocess.run(
        ["sh", "-c", script], input=token + "\n", capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "joined"
    called = _called(prefix)
    assert called["argv"] == [
        "server",
        "join",
        "--token",
        token,
        "--data-dir",
        f"{prefix}/data",
        *flags,
        "--yes",
    ]
    assert called["shiv_root"] == f"{prefix}/.shiv"
    assert not (prefix / "pwned").exists() and not Path("pwned").exists()


def test_nohup_start_runs_server_run_and_spares_a_stranger_in_the_pid_file(
    prefix: Path,
) -> None:
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        (prefix / "server.pid").write_text(f"{stranger.pid}\n")
        script = serveradd.start_script(str(prefix), systemd=False)
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert _called(prefix)["argv"] == ["server", "run", "--data-dir", f"{prefix}/data"]
        started = int((prefix / "server.pid").read_text())
        assert started != stranger.pid
        assert stranger.poll() is None, "a pid file's stale pid is not ours to kill"
    finally:
        stranger.kill()
        stranger.wait()


def test_existing_script_finds_a_data_dir(prefix: Path) -> None:
    script = serveradd.existing_script(str(prefix))

    def run() -> str:
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout

    assert run() == ""
    (prefix / "data").mkdir()
    (prefix / "data" / "server.yaml").write_text("")
    assert run().strip() == "exists"


@pytest.mark.parametrize(
    "script",
    [
        serveradd.join_script("/opt/llmgw", ["--name", "cp-b"]),
        serveradd.existing_script("/opt/llmgw"),
        serveradd.listener_script("http://127.0.0.1:8080/leader"),
        serveradd.start_script("/opt/llmgw", systemd=True),
        serveradd.start_script("/opt/llmgw", systemd=False),
        keepalived.keepalived_script(),
    ],
    ids=["join", "existing", "listener", "start-systemd", "start-nohup", "keepalived"],
)
def test_the_remote_scripts_are_valid_posix_shell(script: str) -> None:
    # The systemd branches never run here (no systemd): parse them at least.
    for shell in ("sh", "dash", "bash"):
        found = shutil.which(shell)
        if found:
            proc = subprocess.run([found, "-n"], input=script, capture_output=True, text=True)
            assert proc.returncode == 0, f"{shell}: {proc.stderr}"


def test_the_systemd_unit_runs_the_control_plane_from_the_prefix() -> None:
    unit = serveradd.systemd_unit("/opt/llmgw")
    assert (
        "ExecStart=/usr/bin/env python3 /opt/llmgw/llmgw.pyz server run "
        "--data-dir /opt/llmgw/data" in unit
    )
    assert "Restart=always" in unit and "WantedBy=multi-user.target" in unit
    assert serveradd.UNIT_NAME == "llmgw-server.service"


# --- the leader's address and the refusals --------------------------------------------


def test_leader_address_is_the_admin_clients_unless_the_host_cannot_reach_it() -> None:
    la = serveradd.leader_address
    assert la("http://10.0.0.1:8080", "10.0.0.2", [], None) == "10.0.0.1:8080"
    assert la("http://127.0.0.1:8080", "127.0.0.1", ["10.0.0.1:8080"], None) == "127.0.0.1:8080"
    # Run on the leader's machine: loopback here is not the leader seen from the new one.
    assert la("http://127.0.0.1:8080", "cp2", ["10.0.0.1:8080"], None) == "10.0.0.1:8080"
    assert la("http://[::1]:8080", "cp2", ["10.0.0.1:8080"], None) == "10.0.0.1:8080"
    assert la("http://127.0.0.1:8080", "cp2", [], "lb:80") == "lb:80"
    with pytest.raises(ServerAddError, match="pass --leader HOST:PORT"):
        la("http://127.0.0.1:8080", "cp2", [], None)
    with pytest.raises(ServerAddError, match="--leader: 'nope' is not HOST:PORT"):
        la("http://10.0.0.1:8080", "cp2", [], "nope")


def _args(**given: Any) -> argparse.Namespace:
    defaults: dict[str, Any] = {
        "host": "cp2",
        "user": None,
        "ssh_port": 22,
        "ssh_key": None,
        "ssh_option": None,
        "name": None,
        "prefix": "/opt/llmgw",
        "zipapp": None,
        "leader": None,
        "listen": "0.0.0.0:8080",
        "agent_port": 8443,
        "peer_port": 8444,
        "advertise": None,
        "vip": None,
        "interface": None,
        "vrid": None,
        "timeout": 5.0,
    }
    return argparse.Namespace(**{**defaults, **given})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"prefix": "llmgw"}, "--prefix 'llmgw': use an absolute path"),
        ({"prefix": "/opt/$(reboot)"}, "--prefix '/opt/$(reboot)': use an absolute path"),
        ({"prefix": "/opt/llm gw"}, "use an absolute path of plain characters"),
        ({"vip": "10.0.0.100/24"}, "checking the options failed: --vip needs --interface IF"),
        ({"interface": "eth0"}, "--interface goes with --vip"),
        ({"listen": "8080"}, "--listen: '8080' is not HOST:PORT"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(
    given: dict[str, Any], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No client and no ssh: each is refused before either is used.
    assert serveradd.add_server(_args(**given), client=None) == 1  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("llmgw: ")


def test_the_parser_takes_server_add() -> None:
    from llmgw.cli import build_parser

    args = build_parser().parse_args(
        ["server", "add", "cp2", "--name", "cp-b", "--vip", "10.0.0.5/24", "--interface", "ens3"]
    )
    assert (args.host, args.name, args.vip, args.interface) == (
        "cp2",
        "cp-b",
        "10.0.0.5/24",
        "ens3",
    )
    assert (args.prefix, args.listen, args.agent_port, args.peer_port) == (
        "/opt/llmgw",
        "0.0.0.0:8080",
        8443,
        8444,
    )
