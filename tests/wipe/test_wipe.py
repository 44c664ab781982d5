"""``llmgw wipe`` run as a program on a scratch root (``--root``) holding llmgw's files
beside a user's: what it lists is what goes, and nothing else does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from llmgw.agent.slurmdaemons import dropin
from llmgw.client.keepalived import KEEPALIVED_MARK
from llmgw.client.nodeadd import systemd_unit

REPO = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()

# The scratch machine: path -> contents (None: a dir). Links are made apart.
LLMGW_FILES = {
    "etc/systemd/system/llmgw-agent.service": "[Service]\nExecStart=/opt/llmgw/llmgw.pyz\n",
    "etc/systemd/system/llmgw-server.service": "[Service]\n",
    "etc/systemd/system/slurmd.service.d/llmgw.conf": dropin("slurmd", ["slurmd", "-D"]),
    "etc/systemd/system/slurmctld.service.d/llmgw.conf": dropin("slurmctld", ["slurmctld"]),
    "etc/llmgw/notes.txt": "ours\n",
    "etc/keepalived/llmgw.conf": f"{KEEPALIVED_MARK} for control plane cp1.\nvrrp\n",
    "var/lib/llmgw/store.db": "sqlite\n",
    "var/lib/llmgw/server.yaml": "listen: 0.0.0.0:8080\n",
    "var/lib/llmgw/pki/ca.crt": "cert\n",
    "var/lib/llmgw-agent/node.key": "key\n",
    "var/lib/llmgw-agent/firewall.json": "{}\n",
    "var/lib/llmgw-agent/agent.yaml": "weights_dir: /srv\n",  # not llmgw's to take
    "var/lib/llmgw-agent/engines/llama.cpp/llama-server": "binary\n",
    "var/lib/llmgw-weights/hub/model.gguf": "weights\n",
    "opt/llmgw/llmgw.pyz": "zip\n",
    "opt/llmgw/agent.yaml": (
        "server: cp:8443\nstate_dir: /opt/llmgw/state\nweights_dir: /srv/llmgw-models\n"
    ),
    "opt/llmgw/agent.log": "log\n",
    "opt/llmgw/state/node.crt": "cert\n",
    "opt/llmgw/state/weights/a.gguf": "weights\n",
    "opt/llmgw/data/store.db": "sqlite\n",
    "srv/llmgw-models/m.gguf": "weights\n",
}
USER_FILES = {
    "home/x/notes.txt": "mine\n",
    "home/keep/precious.txt": "mine\n",
    "etc/other.conf": "x=1\n",
    "etc/keepalived/keepalived.conf": "# my own keepalived\nvrrp_instance mine {}\n",
    "etc/systemd/system/sshd.service": "[Service]\n",
    "etc/systemd/system/slurmctld.service.d/site.conf": "[Service]\nNice=1\n",
    "etc/systemd/system/munge.service.d/llmgw.conf": "# someone's own, not the agent's\n",
    "srv/data.txt": "mine\n",
}
LINKS = {
    # A link inside the data dir pointing at the user's files: the link goes, they stay.
    "var/lib/llmgw-agent/home-link": "home/keep",
    "etc/systemd/system/multi-user.target.wants/llmgw-agent.service": (
        "etc/systemd/system/llmgw-agent.service"
    ),
}

# What goes with no flag: the data dirs and weights stay, so dirs holding them are taken
# apart around them.
PLAIN = {
    ("unit", "llmgw-agent.service"),
    ("unit", "llmgw-server.service"),
    ("unit", "slurmd.service"),
    ("unit", "slurmctld.service"),
    ("firewall", "table inet llmgw"),
    ("file", "/etc/systemd/system/llmgw-agent.service"),
    ("file", "/etc/systemd/system/multi-user.target.wants/llmgw-agent.service"),
    ("file", "/etc/systemd/system/llmgw-server.service"),
    ("directory", "/etc/systemd/system/slurmd.service.d"),
    ("file", "/etc/systemd/system/slurmctld.service.d/llmgw.conf"),
    ("directory", "/etc/llmgw"),
    ("file", "/etc/keepalived/llmgw.conf"),
    # No weights inside it: the agent's state dir goes whole (its link as a link).
    ("directory", "/var/lib/llmgw-agent"),
    ("file", "/opt/llmgw/llmgw.pyz"),
    ("file", "/opt/llmgw/agent.yaml"),
    ("file", "/opt/llmgw/agent.log"),
    ("file", "/opt/llmgw/state/node.crt"),
}
MODELS = {
    ("directory", "/var/lib/llmgw-weights"),
    ("directory", "/opt/llmgw/state/weights"),
    ("directory", "/srv/llmgw-models"),
}
STORE = {("directory", "/var/lib/llmgw"), ("directory", "/opt/llmgw/data")}


def make_root(root: Path) -> Path:
    for rel, text in {**LLMGW_FILES, **USER_FILES}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for rel, target in LINKS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(root / target)
    return root


def tree(root: Path) -> set[str]:
    """Every file, link and dir under ``root`` (links not followed), from it."""
    out = set()
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            out.add("/" + Path(top, name).relative_to(root).as_posix())
    return out


def wipe(root: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "wipe", "--root", str(root), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def listed(root: Path, *flags: str) -> list[dict[str, object]]:
    done = wipe(root, *flags, "--json")
    assert done.returncode == 0, done.stderr
    items: list[dict[str, object]] = json.loads(done.stdout)
    return items


def as_pairs(items: list[dict[str, object]]) -> set[tuple[str, str]]:
    return {(str(i["kind"]), str(i.get("path", i.get("name")))) for i in items}


def left_after(before: set[str], paths: set[str]) -> set[str]:
    """What should remain of ``before`` once ``paths`` (and all under them) are gone."""
    return {e for e in before if not any(e == p or e.startswith(p + "/") for p in paths)}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), PLAIN),
        (("--models",), PLAIN | MODELS),
        (("--store",), PLAIN | STORE),
    ],
    ids=["plain", "models", "store"],
)
def test_each_flag_lists_its_own_part(
    tmp_path: Path, flags: tuple[str, ...], expected: set[tuple[str, str]]
) -> None:
    root = make_root(tmp_path)
    got = as_pairs(listed(root, *flags))
    # --models or --store take a dir whole that was otherwise taken apart around them.
    if "--models" in flags:
        expected = {e for e in expected if not e[1].startswith("/opt/llmgw/state/")}
        expected |= {("directory", "/opt/llmgw/state")}
    assert got == expected


def test_all_takes_exactly_what_it_lists_and_leaves_the_rest(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    before = tree(root)
    items = listed(root, "--all")
    kinds = {str(i["kind"]) for i in items}
    assert kinds == {"unit", "firewall", "file", "directory"}
    paths = {str(i["path"]) for i in items if "path" in i}
    assert {"/var/lib/llmgw", "/var/lib/llmgw-weights", "/opt/llmgw"} <= paths

    done = wipe(root, "--all", f"--yes-i-mean-{HOST}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree(root) == left_after(before, paths)
    assert (root / "home/keep/precious.txt").read_text() == "mine\n"
    assert (root / "etc/keepalived/keepalived.conf").exists()
    assert not (root / "var/lib/llmgw-agent").exists()


def test_plain_wipe_keeps_the_store_and_the_weights(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    before = tree(root)
    paths = {str(i["path"]) for i in listed(root) if "path" in i}
    done = wipe(root, stdin=f"{HOST}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Type this machine's name" in done.stdout
    assert "/var/lib/llmgw  the control plane's data dir and store (--store)" in done.stdout
    after = tree(root)
    assert after == left_after(before, paths)
    assert {"/var/lib/llmgw/store.db", "/opt/llmgw/data/store.db", "/srv/llmgw-models"} <= after
    assert "/home/keep/precious.txt" in after


def test_a_wrong_answer_or_another_hosts_name_changes_nothing(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    before = tree(root)
    asked = wipe(root, "--all", stdin="not-" + HOST + "\n")
    assert asked.returncode == 1
    assert "nothing was changed" in asked.stdout + asked.stderr
    unanswered = wipe(root, "--all")  # stdin at its end: no answer
    assert unanswered.returncode == 1
    named = wipe(root, "--all", "--yes-i-mean-node7" if HOST != "node7" else "--yes-i-mean-x")
    assert named.returncode == 1
    assert f"--yes-i-mean-{HOST}" in named.stderr
    assert tree(root) == before


def test_json_is_a_stable_list_of_plain_objects(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    first, second = wipe(root, "--json"), wipe(root, "--json")
    assert first.stdout == second.stdout
    items = json.loads(first.stdout)
    for item in items:
        assert set(item) in ({"kind", "path", "reason"}, {"kind", "name", "reason"})
        assert all(isinstance(v, str) and v for v in item.values())


def test_a_path_reached_through_a_link_out_of_the_root_is_left(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "llmgw").mkdir(parents=True)
    (outside / "llmgw" / "llmgw.pyz").write_text("someone else's\n")
    root = tmp_path / "root"
    root.mkdir()
    (root / "opt").symlink_to(outside)  # ROOT/opt/llmgw is really outside ROOT
    (root / "etc/llmgw").mkdir(parents=True)
    done = wipe(root, f"--yes-i-mean-{HOST}")
    assert done.returncode == 1
    assert "link leading out of" in done.stdout
    assert (outside / "llmgw" / "llmgw.pyz").exists()
    assert not (root / "etc/llmgw").exists()


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_an_engine_llmgw_started_is_stopped_and_another_process_left(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    engine, other, reused = (subprocess.Popen(["sleep", "300"]) for _ in range(3))
    # This machine's own "agent": a pid file in the scratch root cannot make it the root's.
    agent = subprocess.Popen(["sh", "-c", "sleep 300; :", "llmgw.pyz", "agent", "run"])
    sleepers += [engine, other, reused, agent]
    (tmp_path / "opt/llmgw").mkdir(parents=True)
    (tmp_path / "opt/llmgw/agent.pid").write_text(f"{agent.pid}\n")
    shards = tmp_path / "var/lib/llmgw-agent/shards"
    shards.mkdir(parents=True)

    def record(name: str, pid: int, create_time: float) -> None:
        body = {"spec": {}, "pid": pid, "create_time": create_time, "started_at": None}
        (shards / f"{name}.json").write_text(json.dumps(body))

    record("r1", engine.pid, psutil.Process(engine.pid).create_time())
    # A record whose pid another process took since (started at another time).
    record("r2", reused.pid, psutil.Process(reused.pid).create_time() - 3600)

    items = listed(tmp_path)
    assert [(i["kind"], i.get("pid")) for i in items if i["kind"] == "process"] == [
        ("process", engine.pid)
    ]
    done = wipe(tmp_path, f"--yes-i-mean-{HOST}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert engine.wait(timeout=30) == -15  # TERM was enough
    assert other.poll() is None and reused.poll() is None and agent.poll() is None
    assert not tmp_path.joinpath("var/lib/llmgw-agent").exists()


def test_a_prefix_named_by_llmgws_unit_loses_only_llmgws_entries(tmp_path: Path) -> None:
    unit = tmp_path / "etc/systemd/system/llmgw-agent.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(systemd_unit("/srv/ai"))
    prefix = tmp_path / "srv/ai"
    for rel in ("llmgw.pyz", "llmgw-0.9.0.pyz", "agent.yaml", "state/node.key", "mine.txt"):
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text("x\n")
    before = tree(tmp_path)
    items = listed(tmp_path)
    paths = {str(i["path"]) for i in items if "path" in i}
    assert {p for p in paths if p.startswith("/srv/")} == {
        "/srv/ai/llmgw.pyz",
        "/srv/ai/llmgw-0.9.0.pyz",
        "/srv/ai/agent.yaml",
        "/srv/ai/state",
    }
    done = wipe(tmp_path, f"--yes-i-mean-{HOST}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree(tmp_path) == left_after(before, paths)
    assert (prefix / "mine.txt").exists()
