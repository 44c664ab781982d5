"""slurm.conf, gres.conf and cgroup.conf as llmgw writes them (``server.slurm.conf``):
nodes built from what agents report (``slurmd -C``'s figures, or the host facts, and
the cards the agent reads from the shared ``nvidia-smi`` captures through its own
reader), the refusals, and Debian's Slurm 22.05 reading the files: slurmctld runs as
primary controller on them and shows the node as written (``scontrol``, through a munged
of the test's own), and ``slurmd -G`` accepts the gres.conf they give."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.server.slurm.conf import (
    ConfCard,
    ConfCluster,
    ConfNode,
    SlurmFiles,
    conf_node,
    gres_type,
    render,
)
from llmgw.wire.hardware import GPU, HostFacts
from llmgw.wire.messages import SlurmdFacts, SlurmStatus
from llmgw.wire.slurmpaths import slurm_paths
from tests.support.fakesmi import cards, fake_smi
from tests.support.ports import free_port
from tests.support.procs import stop_process
from tests.support.shared import SHARED_FIXTURES

H100_XML = SHARED_FIXTURES / "nvidia-smi-q-x_8xH100-80GB-HBM3_580.105.08.xml"
A100_MIG_XML = SHARED_FIXTURES / "nvidia-smi-q-x_A100-SXM4-80GB_MIG-enabled_535.54.03.xml"
H100_MIG_TEXT = SHARED_FIXTURES / "nvidia-smi-q_H100-MIG-enabled_590.48.01.txt"
H100_MIG_LIST = SHARED_FIXTURES / "nvidia-smi-L_H100-MIG-enabled_590.48.01.txt"
SLURMD_C_A100 = SHARED_FIXTURES / "slurmd-C_8xA100-SXM4-80GB_autodetect-nvidia_slurm-25.11.txt"
A100_PARENT = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
# No `nvidia-smi -L` was captured beside the A100 log: ours, for its card (its UUID) and
# its four instances, in 535's layout. Each instance has 14 SMs and 19968 MiB, which on
# an A100 80GB is the 1g.20gb profile; the MIG UUIDs are made up.
A100_MIG_LIST = "\n".join(
    [
        f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {A100_PARENT})",
        *(
            f"  MIG 1g.20gb     Device  {i}: (UUID: MIG-0000000{i}-aaaa-bbbb-cccc-00000000000{i})"
            for i in range(4)
        ),
    ]
)
MiB = 1 << 20
# `slurmd -C` on a 2-CPU VM (Debian 12, Slurm 22.05.8).
VM_SLURMD = SlurmdFacts(
    cpus=2,
    boards=1,
    sockets_per_board=1,
    cores_per_socket=2,
    threads_per_core=1,
    real_memory=24105,
)
VM_HOST = HostFacts(
    hostname="vm", os="linux", arch="x86_64", cpu_count=2, memory_total=24683784 * 1024
)


def cluster(*nodes: ConfNode, cgroups: bool = False, root: str = "/srv/slurm") -> ConfCluster:
    return ConfCluster(
        controller_host="ctl",
        controller_address="10.0.0.1",
        ctld_port=6817,
        slurmd_port=6818,
        partition="llmgw",
        root=root,
        nodes=nodes,
        cgroups=cgroups,
    )


def settings(text: str) -> list[str]:
    """The lines of a file that are not comments or blank."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def smi_body(query: Path, listing: Path | str | None) -> str:
    """An nvidia-smi that prints ``query`` for ``-q -x`` (an XML capture) or for the plain
    ``-q`` only (a text one), and ``listing`` (a file or the text itself) for ``-L``."""
    if query.suffix == ".xml":
        q = f'-q) cat "{query}";;'
    else:
        q = f'-q) [ "$2" = "-x" ] && exit 9; cat "{query}";;'
    if listing is None:
        listed = "-L) exit 9;;"
    elif isinstance(listing, Path):
        listed = f'-L) cat "{listing}";;'
    else:
        listed = f"-L) printf '%s\\n' '{listing}';;"
    return f'case "$1" in {q} {listed} *) exit 3;; esac'


async def read_cards(tmp_path: Path, query: Path, listing: Path | str | None = None) -> list[GPU]:
    """The cards as the agent reads them on a node whose nvidia-smi prints these."""
    tmp_path.mkdir(exist_ok=True)
    nv = cards(tmp_path, fake_smi(tmp_path, smi_body(query, listing)))
    try:
        reading = await nv.read(slow=True)
    finally:
        await nv.close()
    assert reading.source == "nvidia-smi" and reading.gpus
    return reading.gpus


# --- nodes from the agents' reports --------------------------------------------------------


def test_a_two_cpu_node_without_cards_from_slurmd_figures() -> None:
    status = SlurmStatus(version=1, part="slurmd", facts=VM_SLURMD)
    node = conf_node("n1", "10.0.0.2", VM_HOST, status)
    # slurmd -C's figures, with the layout the host facts do not have.
    assert node == ConfNode("n1", "10.0.0.2", 2, 1, 1, 2, 1, 24105)
    files = render(cluster(node))
    assert settings(files.slurm_conf) == [
        "ClusterName=llmgw",
        "SlurmctldHost=ctl(10.0.0.1)",
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "SlurmctldParameters=enable_configless",
        "StateSaveLocation=/srv/slurm/slurmctld",
        "SlurmdSpoolDir=/srv/slurm/slurmd",
        "SlurmctldLogFile=/srv/slurm/log/slurmctld.log",
        "SlurmdLogFile=/srv/slurm/log/slurmd.log",
        "SlurmctldPidFile=/srv/slurm/slurmctld.pid",
        "SlurmdPidFile=/srv/slurm/slurmd.pid",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "NodeName=n1 NodeAddr=10.0.0.2 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 "
        'ThreadsPerCore=1 RealMemory=24105 State=DRAIN Reason="llmgw: not lent"',
        "PartitionName=llmgw Nodes=n1 Default=YES MaxTime=INFINITE State=UP",
    ]
    assert "do not edit by hand" in files.slurm_conf
    assert "`llmgw ctl slurm setup`" in files.slurm_conf
    # No card anywhere: no GresTypes, and a gres.conf of comments alone.
    assert settings(files.gres_conf) == []
    assert files.gres_conf.startswith("# gres.conf\n")
    assert settings(files.cgroup_conf) == [] and "not every node" in files.cgroup_conf


def test_the_system_paths_with_no_root() -> None:
    node = ConfNode("n1", "10.0.0.2", 2)
    conf = render(cluster(node, root="")).slurm_conf
    system = slurm_paths("")
    assert f"StateSaveLocation={system.state_save}\n" in conf
    assert "SlurmdSpoolDir=/var/spool/slurmd\n" in conf
    assert "SlurmctldLogFile=/var/log/slurm/slurmctld.log\n" in conf


def test_cgroups_confine_jobs_when_every_node_can() -> None:
    files = render(cluster(ConfNode("n1", "10.0.0.2", 2), cgroups=True))
    assert "ProctrackType=proctrack/cgroup" in settings(files.slurm_conf)
    assert "TaskPlugin=task/cgroup,task/affinity" in settings(files.slurm_conf)
    assert not any("linuxproc" in line or "task/none" in line for line in files.slurm_conf)
    assert settings(files.cgroup_conf) == [
        "CgroupPlugin=cgroup/v2",
        "ConstrainCores=yes",
        "ConstrainRAMSpace=yes",
        "ConstrainDevices=yes",
    ]


def test_a_node_known_only_by_its_host_facts() -> None:
    facts = HostFacts(hostname="n2", os="linux", arch="x86_64", cpu_count=16, memory_total=64 << 30)
    expected = ConfNode("n2", "10.0.0.3", 16, real_memory=65536)
    assert conf_node("n2", "10.0.0.3", facts, None) == expected
    # An agent that reported but has not run slurmd -C yet: the host facts too.
    assert conf_node("n2", "10.0.0.3", facts, SlurmStatus(version=1)) == expected
    (line,) = [x for x in settings(render(cluster(expected)).slurm_conf) if "NodeName" in x]
    assert line == (
        "NodeName=n2 NodeAddr=10.0.0.3 CPUs=16 RealMemory=65536 "
        'State=DRAIN Reason="llmgw: not lent"'
    )
    # slurmd -C without memory: the host's, not nothing.
    no_memory = SlurmStatus(version=1, facts=replace(VM_SLURMD, real_memory=None))
    assert conf_node("n2", "10.0.0.3", facts, no_memory) == ConfNode(
        "n2", "10.0.0.3", 2, 1, 1, 2, 1, 65536
    )


def test_a_node_that_says_nothing_of_its_cpus_stays_out() -> None:
    assert conf_node("n3", "10.0.0.4", None, None) is None
    unread = HostFacts(hostname="n3", os="linux", arch="x86_64", memory_total=8 << 30)
    assert conf_node("n3", "10.0.0.4", unread, SlurmStatus(version=1)) is None


def test_gres_type_is_slurms_autodetect_name() -> None:
    # Slurm 25.11's AutoDetect=nvidia named the A100-SXM4-80GB so (slurmd -C, captured)...
    captured = re.search(r"Gres=gpu:([^:\s]+):8", SLURMD_C_A100.read_text())
    assert captured is not None
    # ...and nvidia-smi names the same card so (the A100 capture's product_name).
    name = re.search(r"<product_name>(.+)</product_name>", A100_MIG_XML.read_text())
    assert name is not None
    assert gres_type(name.group(1)) == captured.group(1) == "nvidia_a100-sxm4-80gb"
    assert gres_type("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert gres_type("  NVIDIA  GeForce RTX 4090 ") == "nvidia_geforce_rtx_4090"


async def test_eight_h100_from_the_captured_log(tmp_path: Path) -> None:
    gpus = await read_cards(tmp_path, H100_XML)
    facts = replace(VM_HOST, hostname="hgx1", cpu_count=224, gpus=gpus)
    node = conf_node("hgx1", "10.0.1.1", facts, None)
    assert node is not None
    assert node.gpus == tuple(
        ConfCard("nvidia_h100_80gb_hbm3", (f"/dev/nvidia{i}",)) for i in range(8)
    )
    files = render(cluster(node))
    conf = settings(files.slurm_conf)
    assert "GresTypes=gpu" in conf
    (line,) = [x for x in conf if x.startswith("NodeName=")]
    assert " Gres=gpu:nvidia_h100_80gb_hbm3:8 " in line
    assert settings(files.gres_conf) == [
        "AutoDetect=off",
        *(
            f"NodeName=hgx1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia{i}"
            for i in range(8)
        ),
    ]


async def test_an_a100_in_mig_mode_is_its_instances_counted(tmp_path: Path) -> None:
    gpus = await read_cards(tmp_path, A100_MIG_XML, A100_MIG_LIST)
    assert [(g.mig_parent, g.mig_profile) for g in gpus] == [(A100_PARENT, "1g.20gb")] * 4
    node = conf_node("a1", "10.0.1.2", replace(VM_HOST, gpus=gpus), None)
    assert node is not None
    mig = "nvidia_a100-sxm4-80gb_1g.20gb"
    # Each instance a gres of its own, with its card's device file.
    assert node.gpus == (ConfCard(mig, ("/dev/nvidia0",)),) * 4
    files = render(cluster(node))
    assert f"Gres=gpu:{mig}:4" in files.slurm_conf
    # slurmd refuses one file named four times: the instances are counted.
    assert settings(files.gres_conf) == [
        "AutoDetect=off",
        f"NodeName=a1 Name=gpu Type={mig} Count=4",
    ]
    assert "AutoDetect=nvml" in files.gres_conf  # the comment says what confining needs


async def test_a_mig_card_whose_instances_are_not_listed_is_no_gres(tmp_path: Path) -> None:
    # As captured (no -L): the agent reports the card in MIG mode, not usable as a card.
    (card,) = await read_cards(tmp_path, A100_MIG_XML)
    assert card.mig_mode and card.mig_parent is None
    node = conf_node("a1", "10.0.1.2", replace(VM_HOST, gpus=[card]), None)
    assert node is not None and node.gpus == ()
    files = render(cluster(node))
    assert not any("Gres" in line for line in settings(files.slurm_conf))
    assert settings(files.gres_conf) == []


async def test_h100_mig_profiles_are_grouped_by_type(tmp_path: Path) -> None:
    gpus = await read_cards(tmp_path, H100_MIG_TEXT, H100_MIG_LIST)
    node = conf_node("h1", "10.0.1.3", replace(VM_HOST, gpus=gpus), None)
    assert node is not None
    card = "nvidia_h100_80gb_hbm3"
    files = render(cluster(node))
    assert (
        f" Gres=gpu:{card}_3g.40gb:1,gpu:{card}_2g.20gb:1,gpu:{card}_1g.10gb:2 " in files.slurm_conf
    )
    assert settings(files.gres_conf)[1:] == [
        f"NodeName=h1 Name=gpu Type={card}_3g.40gb Count=1",
        f"NodeName=h1 Name=gpu Type={card}_2g.20gb Count=1",
        f"NodeName=h1 Name=gpu Type={card}_1g.10gb Count=2",
    ]


def test_cards_with_files_of_their_own_beside_a_counted_node() -> None:
    several = ConfCard("x", ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21"))
    tracked = ConfNode("n1", "10.0.0.2", 2, gpus=(several, ConfCard("y", ("/dev/nvidia1",))))
    counted = ConfNode("n2", "10.0.0.3", 2, gpus=(ConfCard("z", ("/dev/nvidia0",)),) * 2)
    gres = settings(render(cluster(tracked, counted)).gres_conf)
    assert gres == [
        "AutoDetect=off",
        "NodeName=n1 Name=gpu Type=x MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21",
        "NodeName=n1 Name=gpu Type=y File=/dev/nvidia1",
        "NodeName=n2 Name=gpu Type=z Count=2",
    ]


# --- refusals: a value that would break a file, named ----------------------------------------

GOOD = ConfNode("n1", "10.0.0.2", 2)


@pytest.mark.parametrize(
    ("broken", "named"),
    [
        (cluster(ConfNode("gpu 1", "10.0.0.2", 2)), "'gpu 1'"),
        (cluster(ConfNode("a=b", "10.0.0.2", 2)), "'a=b'"),
        (cluster(ConfNode("n1", "10.0.0.2 x", 2)), "'10.0.0.2 x'"),
        (cluster(GOOD, replace(GOOD, address="10.0.0.3")), "'n1' is given twice"),
        (cluster(replace(GOOD, cpus=0)), "0 CPUs"),
        (replace(cluster(GOOD), partition="my part"), "'my part'"),
        (replace(cluster(GOOD), controller_host="ctl x"), "'ctl x'"),
        (replace(cluster(GOOD), controller_address="a,b"), "'a,b'"),
        (replace(cluster(GOOD), cluster_name="my cluster"), "'my cluster'"),
        (replace(cluster(GOOD), ctld_port=0), "port 0"),
        (cluster(GOOD, root="/srv/my slurm"), "'/srv/my slurm'"),
        (cluster(GOOD, root="srv/slurm"), "'srv/slurm'"),
        (
            cluster(replace(GOOD, gpus=(ConfCard("nvidia a100", ("/dev/nvidia0",)),))),
            "'nvidia a100'",
        ),
        (cluster(replace(GOOD, gpus=(ConfCard("gpu:x", ("/dev/nvidia0",)),))), "'gpu:x'"),
        (cluster(replace(GOOD, gpus=(ConfCard("x", ("dev/nvidia0",)),))), "'dev/nvidia0'"),
        (cluster(replace(GOOD, gpus=(ConfCard("x", ()),))), "no device file"),
        (cluster(), "no node"),
    ],
)
def test_a_value_that_would_break_a_file_is_refused(broken: ConfCluster, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        render(broken)


# --- Debian's Slurm reads the files ---------------------------------------------------------


def write(files: SlurmFiles, root: Path) -> Path:
    """The files beside each other as the agent writes them, and the directories the
    paths under ``root`` name; the slurm.conf path."""
    paths = slurm_paths(str(root))
    for directory in (paths.state_save, paths.slurmd_spool, paths.log_dir):
        Path(directory).mkdir(parents=True, exist_ok=True)
    (root / "gres.conf").write_text(files.gres_conf)
    (root / "cgroup.conf").write_text(files.cgroup_conf)
    conf = root / "slurm.conf"
    conf.write_text(files.slurm_conf)
    return conf


needs_slurm = pytest.mark.skipif(
    shutil.which("slurmctld") is None or shutil.which("slurmd") is None,
    reason="Slurm is not installed (Debian: apt-get install slurmctld slurmd)",
)


@pytest.fixture
def munge_socket(tmp_path: Path) -> Iterator[Path]:
    """A munged of this test's own, on a socket and key of its own: the system's munged
    (/run/munge), which other tests start and stop, is never touched."""
    if shutil.which("munged") is None:
        pytest.skip("munge is not installed (Debian: apt-get install munge)")
    home = tmp_path / "munge"
    home.mkdir(mode=0o700)
    key = home / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = home / "socket"
    names = {"socket": sock, "key-file": key, "pid-file": home / "pid"}
    names |= {"log-file": home / "log", "seed-file": home / "seed"}
    args = [f"--{name}={path}" for name, path in names.items()]
    # munged refuses to run as root without --force (the agent runs it as munge).
    force = ["--force"] if os.geteuid() == 0 else []
    munged = subprocess.Popen(["munged", "--foreground", *force, *args])
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert munged.poll() is None, (home / "log").read_text(errors="replace")
            assert time.monotonic() < deadline, "munged made no socket in 10 s"
            time.sleep(0.05)
        yield sock
    finally:
        stop_process(munged)


@needs_slurm
@pytest.mark.xdist_group("slurm")
def test_slurmctld_runs_as_primary_controller_on_the_files(
    tmp_path: Path, munge_socket: Path
) -> None:
    node = conf_node("n1", "127.0.0.1", VM_HOST, SlurmStatus(version=1, facts=VM_SLURMD))
    assert node is not None
    node = replace(node, gpus=(ConfCard("nvidia_h100_80gb_hbm3", ("/dev/nvidia0",)),))
    root = tmp_path / "slurm"
    host = socket.gethostname().split(".")[0]
    files = render(
        ConfCluster(host, "127.0.0.1", free_port(), free_port(), "llmgw", str(root), (node,), False)
    )
    # The one line added to the files as written: this test's munged, not the system's.
    auth = f"AuthType=auth/munge\nAuthInfo=socket={munge_socket}\n"
    files = replace(files, slurm_conf=files.slurm_conf.replace("AuthType=auth/munge\n", auth))
    conf = write(files, root)
    output = tmp_path / "slurmctld.out"
    with output.open("wb") as out:
        ctld = subprocess.Popen(
            ["slurmctld", "-D", "-f", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while "Running as primary controller" not in output.read_text(errors="replace"):
            assert ctld.poll() is None, f"slurmctld stopped:\n{output.read_text()}"
            assert time.monotonic() < deadline, f"slurmctld never ran:\n{output.read_text()}"
            time.sleep(0.1)
        # Slurm took the node as written: drained with our reason, its cards, its figures.
        shown = subprocess.run(
            ["scontrol", "show", "node", "n1", "-o"],
            env={**os.environ, "SLURM_CONF": str(conf)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert shown.returncode == 0, shown.stderr
    finally:
        stop_process(ctld, grace=10)
    said = shown.stdout
    assert re.search(r" State=\S*\+DRAIN ", said), said
    assert said.rstrip().endswith("Reason=llmgw: not lent"), said
    for figure in ("CPUTot=2", "RealMemory=24105", "Gres=gpu:nvidia_h100_80gb_hbm3:1"):
        assert f" {figure} " in said, said
    assert "Partitions=llmgw " in said
    text = output.read_text(errors="replace")
    assert "fatal" not in text and "started on cluster llmgw" in text


@needs_slurm
async def test_slurmd_takes_the_gres_conf_for_tracked_and_counted_nodes(tmp_path: Path) -> None:
    # slurmd -G reads its node's gres.conf against slurm.conf and exits: it stats each
    # File=, so the tracked node's cards are given files this machine has.
    plain = ConfNode(
        "n1",
        "127.0.0.1",
        2,
        gpus=(
            ConfCard("nvidia_h100_80gb_hbm3", ("/dev/null",)),
            ConfCard("nvidia_h100_80gb_hbm3", ("/dev/zero",)),
        ),
    )
    gpus = await read_cards(tmp_path / "smi", A100_MIG_XML, A100_MIG_LIST)
    mig = conf_node("n2", "127.0.0.2", replace(VM_HOST, gpus=gpus), None)
    assert mig is not None
    root = tmp_path / "slurm"
    files = render(
        ConfCluster("ctl", "127.0.0.1", 6817, 6818, "llmgw", str(root), (plain, mig), False)
    )
    conf = write(files, root)
    for name, shows in (("n1", ["File=/dev/null", "File=/dev/zero"]), ("n2", [])):
        done = subprocess.run(
            ["slurmd", "-G", "-f", str(conf), "-N", name],
            capture_output=True,
            text=True,
            timeout=30,
        )
        said = done.stdout + done.stderr
        assert done.returncode == 0, said
        assert not re.search(r"error|fatal|WARNING", said), said
        for text in shows:
            assert text in said
